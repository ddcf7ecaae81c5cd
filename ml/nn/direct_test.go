package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
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
			labels := make([]uint8, batch)
			for i := range labels {
				labels[i] = uint8(r.IntN(spec.Classes))
			}
			for i := range d.Input() {
				v := float32(r.Float64())
				d.Input()[i], g.Input()[i] = v, v
			}
			d.SetLabels(labels)
			g.SetLabels(labels)
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
