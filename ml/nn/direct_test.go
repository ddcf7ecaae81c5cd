package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/ml/model"
)

// TestDirectPassMatchesTheGraph runs the written-out pass (New) and
// gorgonia's graph (newGraph) on the same weights and batch: same loss,
// logits and gradients up to float32 rounding, over two steps (the
// second checks that nothing of the first leaks into it).
func TestDirectPassMatchesTheGraph(t *testing.T) {
	for _, spec := range []model.Spec{
		{Input: 784, Hidden: []int{800}, Classes: 10},
		{Input: 7, Hidden: []int{6, 5}, Classes: 3},
		{Input: 5, Classes: 4}, // no hidden layer
	} {
		const batch = 16
		d, err := New(spec, batch, true)
		if err != nil {
			t.Fatal(err)
		}
		g, err := newGraph(spec, batch, true)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(3, 4))
		for step := range 2 {
			for i, w := range spec.Init(uint64(step + 1)) {
				for j := range w {
					w[j] += float32(r.NormFloat64() * 0.05)
				}
				copy(d.Params()[i], w)
				copy(g.Params()[i], w)
			}
			randomBatch(r, spec, batch, d, g)
			dl, err := d.Step()
			if err != nil {
				t.Fatal(err)
			}
			gl, err := g.Step()
			if err != nil {
				t.Fatal(err)
			}
			if !close32(dl, gl) {
				t.Fatalf("%v step %d: loss %v, graph %v", spec, step, dl, gl)
			}
			compare(t, "logits", d.Logits(), g.Logits())
			dg, err := d.Grads()
			if err != nil {
				t.Fatal(err)
			}
			gg, err := g.Grads()
			if err != nil {
				t.Fatal(err)
			}
			if len(dg) != len(gg) {
				t.Fatalf("%d gradients, graph %d", len(dg), len(gg))
			}
			for i := range dg {
				compare(t, spec.Variables()[i].Name, dg[i], gg[i])
			}
		}
		d.Close()
		g.Close()
	}
}

// randomBatch gives every net the same random batch: inputs in [0, 1)
// and labels.
func randomBatch(r *rand.Rand, spec model.Spec, batch int, nets ...*Net) {
	labels := make([]uint8, batch)
	for i := range labels {
		labels[i] = uint8(r.IntN(spec.Classes))
	}
	x := make([]float32, len(nets[0].Input()))
	for i := range x {
		x[i] = float32(r.Float64())
	}
	for _, n := range nets {
		copy(n.Input(), x)
		n.SetLabels(labels)
	}
}

func close32(a, b float32) bool {
	return math.Abs(float64(a-b)) <= 1e-5+1e-4*math.Abs(float64(b))
}

func compare(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, graph %d", what, len(got), len(want))
	}
	var nonzero int
	for i := range got {
		if !close32(got[i], want[i]) {
			t.Fatalf("%s[%d] = %v, graph %v", what, i, got[i], want[i])
		}
		if want[i] != 0 {
			nonzero++
		}
	}
	if nonzero == 0 {
		t.Fatalf("%s: all zero in the graph: the comparison shows nothing", what)
	}
}

func TestEvalNetRunsTheDirectForwardPass(t *testing.T) {
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	d, err := New(spec, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g, err := newGraph(spec, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i, w := range spec.Init(9) {
		copy(d.Params()[i], w)
		copy(g.Params()[i], w)
	}
	for i := range d.Input() {
		d.Input()[i], g.Input()[i] = float32(i)/8, float32(i)/8
	}
	d.SetLabels([]uint8{1, 0})
	g.SetLabels([]uint8{1, 0})
	dl, _ := d.Step()
	gl, err := g.Step()
	if err != nil {
		t.Fatal(err)
	}
	if !close32(dl, gl) {
		t.Fatalf("loss %v, graph %v", dl, gl)
	}
	compare(t, "logits", d.Logits(), g.Logits())
}

// A short batch (fewer labels than rows) leaves the unlabelled rows out
// of the gradient in the written-out pass as in the graph: every gradient
// matches, not only the loss.
func TestDirectPassShortBatchMatchesTheGraph(t *testing.T) {
	spec := model.Spec{Input: 5, Hidden: []int{6}, Classes: 4}
	const batch = 4
	d, err := New(spec, batch, true)
	if err != nil {
		t.Fatal(err)
	}
	g, err := newGraph(spec, batch, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range spec.Init(1) {
		copy(d.Params()[i], w)
		copy(g.Params()[i], w)
	}
	for i := range d.Input() {
		d.Input()[i], g.Input()[i] = float32(i%7)/7, float32(i%7)/7
	}
	d.SetLabels([]uint8{1, 2})
	g.SetLabels([]uint8{1, 2})
	dl, err := d.Step()
	if err != nil {
		t.Fatal(err)
	}
	gl, err := g.Step()
	if err != nil {
		t.Fatal(err)
	}
	if !close32(dl, gl) {
		t.Fatalf("loss %v, graph %v", dl, gl)
	}
	dg, err := d.Grads()
	if err != nil {
		t.Fatal(err)
	}
	gg, err := g.Grads()
	if err != nil {
		t.Fatal(err)
	}
	for i := range dg {
		compare(t, fmt.Sprintf("gradient %d", i), dg[i], gg[i])
	}
}

// SetEarlyRows: the first layer's weight gradient comes in row blocks,
// the last first, each announced once final, with every other gradient
// already final; the whole gradient is the one-product pass's.
func TestEarlyRowsAnnounceFinalGradients(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	const batch = 32
	ref, err := New(spec, batch, true)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	e, err := New(spec, batch, true)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	out := spec.Hidden[0]
	r := rand.New(rand.NewPCG(5, 6))
	for step := range 2 {
		for i, w := range spec.Init(uint64(step + 7)) {
			copy(ref.Params()[i], w)
			copy(e.Params()[i], w)
		}
		randomBatch(r, spec, batch, ref, e)
		wantLoss, err := ref.Step()
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.Grads()
		if err != nil {
			t.Fatal(err)
		}
		got, err := e.Grads()
		if err != nil {
			t.Fatal(err)
		}
		var calls []int
		ok := e.SetEarlyRows([]int{200, 397}, func(row int, loss float32) {
			calls = append(calls, row)
			if loss != wantLoss {
				t.Errorf("step %d: ready(%d) with loss %v, the step's is %v", step, row, loss, wantLoss)
			}
			compare(t, fmt.Sprintf("step %d, rows %d and up at ready(%d)", step, row, row), got[0][row*out:], want[0][row*out:])
			for v := 1; v < len(got); v++ {
				compare(t, fmt.Sprintf("step %d, %s at ready(%d)", step, spec.Variables()[v].Name, row), got[v], want[v])
			}
			if step == 0 {
				// The blocks below are not computed yet: still the net's
				// fresh zeros.
				for i, x := range got[0][:row*out] {
					if x != 0 {
						t.Fatalf("ready(%d): row %d already written", row, i/out)
					}
				}
			}
		})
		if !ok {
			t.Fatal("SetEarlyRows refused rows 200, 397")
		}
		loss, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(calls) != "[397 200]" {
			t.Fatalf("step %d: ready called for rows %v, want [397 200]", step, calls)
		}
		if !close32(loss, wantLoss) {
			t.Fatalf("step %d: loss %v, one product %v", step, loss, wantLoss)
		}
		for v := range got {
			compare(t, spec.Variables()[v].Name, got[v], want[v])
		}
	}
	// Off again: one product, no calls.
	if !e.SetEarlyRows(nil, nil) {
		t.Fatal("SetEarlyRows(nil) refused")
	}
	called := false
	e.SetEarlyRows(nil, func(int, float32) { called = true })
	if _, err := e.Step(); err != nil || called {
		t.Fatalf("after SetEarlyRows(nil): err %v, ready called %v", err, called)
	}
	for _, rows := range [][]int{{0}, {784}, {397, 200}, {200, 200}, {-1, 3}} {
		if e.SetEarlyRows(rows, func(int, float32) {}) {
			t.Errorf("SetEarlyRows(%v) accepted", rows)
		}
	}
	eval, err := New(spec, batch, false)
	if err != nil {
		t.Fatal(err)
	}
	defer eval.Close()
	if eval.SetEarlyRows([]int{200}, func(int, float32) {}) {
		t.Error("a net without gradients accepted early rows")
	}
}

// ForwardRows: the part of the forward pass computed ahead is the one
// the step uses, and the step's results are bit for bit those of a step
// computed at once (the same blocks, added in the same order); Forget
// drops it.
func TestForwardRowsAhead(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	const batch = 16
	nets := earlyPair(t, spec, batch, []int{200, 397}) // nets[0] computes each step at once, nets[1] partly ahead
	out := spec.Hidden[0]
	r := rand.New(rand.NewPCG(8, 9))
	load := func(seed uint64) {
		for i, w := range spec.Init(seed) {
			copy(nets[0].Params()[i], w)
			copy(nets[1].Params()[i], w)
		}
		randomBatch(r, spec, batch, nets...)
	}
	step := func() (float32, float32, bool) { return stepBoth(t, nets) }
	for i, ahead := range [][]int{{397}, {397, 200}, {200}, {}} {
		load(uint64(i + 1))
		for _, row := range ahead {
			if !nets[1].ForwardRows(row) {
				t.Fatalf("ForwardRows(%d) refused", row)
			}
		}
		if a, b, same := step(); !same {
			t.Fatalf("ahead from rows %v: loss %v, at once %v, or the gradients differ", ahead, b, a)
		}
	}

	// What was computed ahead is used: rows changed after it do not
	// count until Forget.
	load(7)
	if !nets[1].ForwardRows(397) {
		t.Fatal("ForwardRows(397) refused")
	}
	clear(nets[1].Params()[0][397*out:])
	if _, _, same := step(); !same {
		t.Fatal("the step recomputed the rows computed ahead")
	}
	load(8)
	nets[1].ForwardRows(397)
	clear(nets[0].Params()[0][397*out:])
	clear(nets[1].Params()[0][397*out:])
	nets[1].Forget()
	if a, b, same := step(); !same {
		t.Fatalf("after Forget: loss %v, at once %v, or the gradients differ", b, a)
	}
	// A step forgets: the next one (same input, the rows changed)
	// computes in full.
	load(9)
	nets[1].ForwardRows(397)
	if a, b, same := step(); !same {
		t.Fatalf("ahead from row 397: loss %v, at once %v, or the gradients differ", b, a)
	}
	clear(nets[0].Params()[0][397*out:])
	clear(nets[1].Params()[0][397*out:])
	if a, b, same := step(); !same {
		t.Fatalf("a step after one ahead: loss %v, at once %v, or the gradients differ", b, a)
	}

	for _, row := range []int{0, 100, 784} {
		if nets[1].ForwardRows(row) {
			t.Errorf("ForwardRows(%d) accepted: not a row the net splits at", row)
		}
	}
	plain, err := New(spec, batch, true)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if plain.ForwardRows(397) {
		t.Error("a net without early rows accepted ForwardRows")
	}
}

// ReadFrom: a net that reads its parameters from other buffers computes
// what one reading Params() does, bit for bit (computed ahead or not);
// Own copies them into Params() and reads from there again.
func TestReadFromOtherBuffers(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	const batch = 16
	nets := earlyPair(t, spec, batch, []int{397}) // nets[1] reads from bufs
	out := spec.Hidden[0]
	init := spec.Init(4)
	for v, w := range init {
		copy(nets[0].Params()[v], w)
		clear(nets[1].Params()[v]) // not read
	}
	// The pieces: the first variable's two blocks, every other whole.
	bufs := [][]float32{slices.Clone(init[0][:397*out]), slices.Clone(init[0][397*out:])}
	if !nets[1].ReadFrom(0, 0, bufs[0]) || !nets[1].ReadFrom(0, 397, bufs[1]) {
		t.Fatal("ReadFrom refused the first variable's blocks")
	}
	for v := 1; v < len(init); v++ {
		bufs = append(bufs, slices.Clone(init[v]))
		if !nets[1].ReadFrom(v, 0, bufs[len(bufs)-1]) {
			t.Fatalf("ReadFrom refused variable %d", v)
		}
	}
	r := rand.New(rand.NewPCG(10, 11))
	same := func(what string) {
		t.Helper()
		if a, b, ok := stepBoth(t, nets); !ok {
			t.Fatalf("%s: loss %v, reading Params() %v, or the gradients differ", what, b, a)
		}
	}
	randomBatch(r, spec, batch, nets...)
	same("read from other buffers")
	randomBatch(r, spec, batch, nets...)
	nets[1].ForwardRows(397)
	same("read from other buffers, computed ahead")

	// Own: Params() now holds them, and the buffers are no longer read.
	nets[1].Own()
	for v, w := range init {
		if !slices.Equal(nets[1].Params()[v], w) {
			t.Fatalf("after Own, Params()[%d] is not what was read", v)
		}
	}
	for _, b := range bufs {
		clear(b)
	}
	randomBatch(r, spec, batch, nets...)
	same("after Own")
	// ReadFrom(.., nil) reads Params() again, copying nothing.
	if !nets[1].ReadFrom(1, 0, bufs[2]) || !nets[1].ReadFrom(1, 0, nil) {
		t.Fatal("ReadFrom of the first bias refused")
	}
	randomBatch(r, spec, batch, nets...)
	same("after ReadFrom(nil)")

	for _, c := range []struct {
		v, row, n int
	}{{0, 100, 100 * out}, {0, 397, 10}, {0, 0, 784 * out}, {1, 0, 3}, {2, 5, 5 * 10}} {
		if nets[1].ReadFrom(c.v, c.row, make([]float32, c.n)) {
			t.Errorf("ReadFrom(%d, %d, %d values) accepted: not a piece", c.v, c.row, c.n)
		}
	}
}

// earlyPair is two training nets for spec and batch with early rows
// rows, closed when the test ends.
func earlyPair(t *testing.T, spec model.Spec, batch int, rows []int) []*Net {
	t.Helper()
	nets := make([]*Net, 2)
	for i := range nets {
		n, err := New(spec, batch, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		if !n.SetEarlyRows(rows, func(int, float32) {}) {
			t.Fatal("SetEarlyRows refused")
		}
		nets[i] = n
	}
	return nets
}

// stepBoth runs a step of both nets and returns their losses and
// whether the losses and gradients are the same bits.
func stepBoth(t *testing.T, nets []*Net) (float32, float32, bool) {
	t.Helper()
	var loss [2]float32
	var grads [2][][]float32
	for i, n := range nets {
		var err error
		if loss[i], err = n.Step(); err != nil {
			t.Fatal(err)
		}
		if grads[i], err = n.Grads(); err != nil {
			t.Fatal(err)
		}
	}
	same := loss[0] == loss[1]
	for v := range grads[0] {
		same = same && slices.Equal(grads[0][v], grads[1][v])
	}
	return loss[0], loss[1], same
}
