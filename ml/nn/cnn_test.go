package nn

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pstrain/pstrain/ml/conv"
	"github.com/pstrain/pstrain/ml/model"
)

// refLoss is an independent float64 reference of the CNN's loss: direct
// convolution loops (no im2col, no BLAS) over the same NHWC layout and
// kernel order (out channel, ky, kx, in channel), the same pooling and
// dense layers, mean softmax cross-entropy.
func refLoss(spec model.Spec, params [][]float64, x []float64, labels []int, batch int) float64 {
	const k = model.KernelSize
	layers := spec.ConvLayers()
	var loss float64
	for b := 0; b < batch; b++ {
		in := x[b*spec.Input : (b+1)*spec.Input]
		for l, g := range layers {
			w, bias := params[2*l], params[2*l+1]
			pooled := make([]float64, g.PoolH*g.PoolW*g.Out)
			for py := 0; py < g.PoolH; py++ {
				for px := 0; px < g.PoolW; px++ {
					for o := 0; o < g.Out; o++ {
						best := math.Inf(-1)
						for dy := 0; dy < 2; dy++ {
							for dx := 0; dx < 2; dx++ {
								oy, ox := 2*py+dy, 2*px+dx
								s := bias[o]
								for ky := 0; ky < k; ky++ {
									for kx := 0; kx < k; kx++ {
										for c := 0; c < g.InC; c++ {
											s += w[o*g.K()+(ky*k+kx)*g.InC+c] * in[((oy+ky)*g.InW+ox+kx)*g.InC+c]
										}
									}
								}
								best = math.Max(best, math.Max(s, 0))
							}
						}
						pooled[(py*g.PoolW+px)*g.Out+o] = best
					}
				}
			}
			in = pooled
		}
		off := 2 * len(layers)
		dims := append(append([]int{spec.Features()}, spec.Hidden...), spec.Classes)
		for l := 0; l+1 < len(dims); l++ {
			w, bias := params[off+2*l], params[off+2*l+1]
			out := make([]float64, dims[l+1])
			for j := range out {
				s := bias[j]
				for i, v := range in {
					s += v * w[i*dims[l+1]+j]
				}
				if l+2 < len(dims) {
					s = math.Max(s, 0)
				}
				out[j] = s
			}
			in = out
		}
		hi := math.Inf(-1)
		for _, v := range in {
			hi = math.Max(hi, v)
		}
		var sum float64
		for _, v := range in {
			sum += math.Exp(v - hi)
		}
		loss -= in[labels[b]] - hi - math.Log(sum)
	}
	return loss / float64(batch)
}

// smallCNN is a CNN small enough for finite differences on every
// parameter, with two conv blocks (so col2im is exercised), an odd map
// (17 -> 13 conv -> 6 pool drops a row), two input channels and two
// dense layers.
func smallCNN() model.Spec {
	return model.Spec{Kind: model.KindCNN, Input: 17 * 16 * 2, Height: 17, Width: 16, Conv: []int{3, 4}, Hidden: []int{5}, Classes: 3}
}

func randomCNN(t *testing.T, spec model.Spec, batch int, seed uint64) (*Net, []uint8) {
	t.Helper()
	n, err := New(spec, batch, true)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 2))
	for i, w := range spec.Init(seed) {
		copy(n.Params()[i], w)
		for j := range n.Params()[i] {
			n.Params()[i][j] += float32(r.NormFloat64() * 0.05) // non-zero biases too
		}
	}
	for i := range n.Input() {
		n.Input()[i] = float32(r.Float64())
	}
	labels := make([]uint8, batch)
	for i := range labels {
		labels[i] = uint8(r.IntN(spec.Classes))
	}
	n.SetLabels(labels)
	return n, labels
}

// TestCNNGradientsMatchFiniteDifferences checks every gradient element of
// the im2col/BLAS CNN against central differences of the float64
// reference. In float64 with h = 1e-6 the differences are accurate to
// about 1e-9 and no ReLU or pooling choice flips; the net computes in
// float32 (relative error ~1e-6 per product, sums of a few hundred terms),
// so 1e-4 absolute plus 1e-3 relative is a bound it meets with margin
// while a wrong index or a missing term is off by the size of a gradient.
func TestCNNGradientsMatchFiniteDifferences(t *testing.T) {
	for _, spec := range []model.Spec{smallCNN(), oneChannelCNN()} {
		checkGradients(t, spec)
	}
}

// oneChannelCNN is smallCNN's shape with one input channel and a first
// block of 16 channels: on amd64 with AVX2 and FMA its first block
// convolves directly (package conv).
func oneChannelCNN() model.Spec {
	return model.Spec{Kind: model.KindCNN, Input: 17 * 16, Height: 17, Width: 16, Conv: []int{16, 2}, Hidden: []int{5}, Classes: 3}
}

// TestCNNConvolvesDirectlyWhereItCan: the first block of one input
// channel convolves directly where package conv runs its channels on
// the assembly, and with im2col otherwise (two input channels, or 8
// channels).
func TestCNNConvolvesDirectlyWhereItCan(t *testing.T) {
	for _, c := range []struct {
		spec   model.Spec
		direct bool
	}{
		{oneChannelCNN(), conv.Fast(16)},
		{smallCNN(), false},
		{model.Spec{Kind: model.KindCNN, Input: 17 * 16, Height: 17, Width: 16, Conv: []int{8, 16}, Hidden: []int{5}, Classes: 3}, false},
	} {
		for _, train := range []bool{true, false} {
			n, err := New(c.spec, 2, train)
			if err != nil {
				t.Fatal(err)
			}
			if got := n.impl.(*cnnNet).direct; got != c.direct {
				t.Errorf("conv %v, %d input channels, train %t: direct %t, want %t", c.spec.Conv, c.spec.Input/(17*16), train, got, c.direct)
			}
		}
	}
}

func checkGradients(t *testing.T, spec model.Spec) {
	const batch = 3
	n, labels := randomCNN(t, spec, batch, 5)
	defer n.Close()
	loss, err := n.Step()
	if err != nil {
		t.Fatal(err)
	}
	gs, err := n.Grads()
	if err != nil {
		t.Fatal(err)
	}
	params := make([][]float64, len(n.Params()))
	for i, p := range n.Params() {
		for _, v := range p {
			params[i] = append(params[i], float64(v))
		}
	}
	x := make([]float64, len(n.Input()))
	for i, v := range n.Input() {
		x[i] = float64(v)
	}
	ls := make([]int, batch)
	for i, l := range labels {
		ls[i] = int(l)
	}
	ref := refLoss(spec, params, x, ls, batch)
	if math.Abs(ref-float64(loss)) > 1e-5*math.Max(1, ref) {
		t.Fatalf("loss %v, reference %v", loss, ref)
	}
	const h = 1e-6
	vars := spec.Variables()
	for vi, p := range params {
		for j := range p {
			orig := p[j]
			p[j] = orig + h
			up := refLoss(spec, params, x, ls, batch)
			p[j] = orig - h
			down := refLoss(spec, params, x, ls, batch)
			p[j] = orig
			num := (up - down) / (2 * h)
			if d := math.Abs(num - float64(gs[vi][j])); d > 1e-4+1e-3*math.Abs(num) {
				t.Fatalf("conv %v: %s[%d]: analytic %v, numeric %v", spec.Conv, vars[vi].Name, j, gs[vi][j], num)
			}
		}
	}
}

// Unlabelled rows (a short last batch) contribute nothing, as in the MLP.
func TestCNNUnlabelledRowsContributeNothing(t *testing.T) {
	spec := smallCNN()
	n, labels := randomCNN(t, spec, 3, 9)
	n.SetLabels(labels[:2])
	full, err := n.Step()
	if err != nil {
		t.Fatal(err)
	}
	g3, _ := n.Grads()
	want := append([]float32(nil), g3[0]...)
	// The same two labelled rows with the third image changed: same loss
	// and gradients.
	for i := 2 * spec.Input; i < 3*spec.Input; i++ {
		n.Input()[i] = 0.5
	}
	again, _ := n.Step()
	g, _ := n.Grads()
	if again != full {
		t.Fatalf("loss changed with an unlabelled row: %v vs %v", again, full)
	}
	for i := range want {
		if g[0][i] != want[i] {
			t.Fatalf("gradient changed with an unlabelled row at %d", i)
		}
	}
}

// Two nets with the same inputs compute bit-identical losses and
// gradients, and a second Step on the same net repeats the first.
func TestCNNDeterministic(t *testing.T) {
	spec := model.Spec{Kind: model.KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{4, 6}, Hidden: []int{16}, Classes: 10}
	a, _ := randomCNN(t, spec, 8, 3)
	b, _ := randomCNN(t, spec, 8, 3)
	la, _ := a.Step()
	lb, _ := b.Step()
	ga, _ := a.Grads()
	gb, _ := b.Grads()
	snap := make([][]float32, len(ga))
	for i := range ga {
		snap[i] = append([]float32(nil), ga[i]...)
	}
	la2, _ := a.Step()
	ga2, _ := a.Grads()
	if la != lb || la != la2 {
		t.Fatalf("losses %v %v %v", la, lb, la2)
	}
	for i := range ga {
		if len(ga[i]) != spec.Variables()[i].Size() {
			t.Fatalf("gradient %d has %d elements, want %d", i, len(ga[i]), spec.Variables()[i].Size())
		}
		for j := range ga[i] {
			if snap[i][j] != gb[i][j] || snap[i][j] != ga2[i][j] {
				t.Fatalf("gradient %d[%d] differs: %v %v %v", i, j, snap[i][j], gb[i][j], ga2[i][j])
			}
		}
	}
	if len(a.Logits()) != 8*10 {
		t.Fatalf("logits len %d", len(a.Logits()))
	}
}

// An eval net runs forward only, and its logits are the training net's.
func TestCNNEvalNet(t *testing.T) {
	spec := smallCNN()
	tr, _ := randomCNN(t, spec, 2, 4)
	ev, err := New(spec, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range tr.Params() {
		copy(ev.Params()[i], p)
	}
	copy(ev.Input(), tr.Input())
	if _, err := tr.Step(); err != nil {
		t.Fatal(err)
	}
	if _, err := ev.Step(); err != nil {
		t.Fatal(err)
	}
	if _, err := ev.Grads(); err == nil {
		t.Fatal("Grads on an eval net should fail")
	}
	for i, v := range tr.Logits() {
		if ev.Logits()[i] != v {
			t.Fatalf("logit %d: eval %v, train %v", i, ev.Logits()[i], v)
		}
	}
}

// A few hundred SGD steps on a fixed batch drive the loss down: the
// gradients point downhill on the real net, not just on the reference.
func TestCNNLearnsABatch(t *testing.T) {
	spec := model.Spec{Kind: model.KindCNN, Input: 144, Height: 12, Width: 12, Conv: []int{4}, Hidden: []int{8}, Classes: 2}
	n, _ := randomCNN(t, spec, 16, 11)
	labels := make([]uint8, 16)
	for b := range labels { // class 1: a bright left half
		labels[b] = uint8(b % 2)
		for i := 0; i < 144; i++ {
			v := float32(0.1)
			if labels[b] == 1 && i%12 < 6 {
				v = 0.9
			}
			n.Input()[b*144+i] = v
		}
	}
	n.SetLabels(labels)
	first, _ := n.Step()
	var last float32
	for range 200 {
		last, _ = n.Step()
		g, _ := n.Grads()
		for i, p := range n.Params() {
			for j := range p {
				p[j] -= 0.1 * g[i][j]
			}
		}
	}
	if !(last < first/10) {
		t.Fatalf("loss %v -> %v after 200 steps", first, last)
	}
}

// An eval net convolves in chunks of ConvChunk images; a batch that is
// not a multiple of it (a partial last chunk) gives each image the
// logits a training net of one image computes.
func TestCNNEvalChunksMatchEachImage(t *testing.T) {
	spec := model.Spec{Kind: model.KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{16, 6}, Hidden: []int{16}, Classes: 10}
	const batch = 2*ConvChunk + 5
	tr, _ := randomCNN(t, spec, batch, 6) // the parameters and images
	one, _ := randomCNN(t, spec, 1, 6)
	ev, err := New(spec, batch, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range tr.Params() {
		copy(ev.Params()[i], p)
	}
	copy(ev.Input(), tr.Input())
	if _, err := ev.Step(); err != nil {
		t.Fatal(err)
	}
	k := spec.Classes
	for img := range batch {
		copy(one.Input(), tr.Input()[img*spec.Input:(img+1)*spec.Input])
		if _, err := one.Step(); err != nil {
			t.Fatal(err)
		}
		for j, v := range one.Logits() {
			if got := ev.Logits()[img*k+j]; math.Abs(float64(got-v)) > 1e-5*math.Max(1, math.Abs(float64(v))) {
				t.Fatalf("image %d logit %d: eval %v, a net of that image %v", img, j, got, v)
			}
		}
	}
}

// A training net takes its batch ConvChunk images at a time: its
// gradients over a batch of two whole chunks and a partial one are the
// mean of each image's own (a net of batch 1), for channel counts the
// pooling's assembly takes (multiples of 8) and others.
func TestCNNChunksSumToTheBatchGradient(t *testing.T) {
	specs := []model.Spec{smallCNN(), oneChannelCNN(),
		{Kind: model.KindCNN, Input: 17 * 16, Height: 17, Width: 16, Conv: []int{8, 16}, Hidden: []int{5}, Classes: 3}}
	for _, spec := range specs {
		const batch = 2*ConvChunk + 3
		n, labels := randomCNN(t, spec, batch, 11)
		if _, err := n.Step(); err != nil {
			t.Fatal(err)
		}
		got, _ := n.Grads()
		one, _ := randomCNN(t, spec, 1, 11) // the same parameters
		want := make([][]float64, len(got))
		for i := range want {
			want[i] = make([]float64, len(got[i]))
		}
		for img := range batch {
			copy(one.Input(), n.Input()[img*spec.Input:(img+1)*spec.Input])
			one.SetLabels(labels[img : img+1])
			if _, err := one.Step(); err != nil {
				t.Fatal(err)
			}
			g, _ := one.Grads()
			for i := range g {
				for j, v := range g[i] {
					want[i][j] += float64(v) / batch
				}
			}
		}
		vars := spec.Variables()
		for i := range got {
			for j, v := range got[i] {
				if d := math.Abs(float64(v) - want[i][j]); d > 1e-5+1e-4*math.Abs(want[i][j]) {
					t.Fatalf("conv %v: %s[%d] = %v, the images' mean %v", spec.Conv, vars[i].Name, j, v, want[i][j])
				}
			}
		}
	}
}

// im2col's patches are their definition, col[(b, oy, ox), (ky, kx, c)] =
// in[b, oy+ky, ox+kx, c], for one input channel (im2col5) and several;
// col2im sums each patch value back where it came from.
func TestIm2colIsItsDefinition(t *testing.T) {
	const k = model.KernelSize
	r := rand.New(rand.NewPCG(13, 17))
	for _, inC := range []int{1, 3} {
		g := model.ConvLayer{InH: 11, InW: 9, InC: inC, OutH: 7, OutW: 5, Out: 2}
		const batch = 3
		in := make([]float32, batch*g.InH*g.InW*inC)
		for i := range in {
			in[i] = float32(r.NormFloat64())
		}
		col := make([]float32, batch*g.OutH*g.OutW*g.K())
		im2col(in, g, batch, col)
		want := make([]float32, len(in))
		row := 0
		for b := range batch {
			for oy := range g.OutH {
				for ox := range g.OutW {
					for ky := range k {
						for kx := range k {
							for c := range inC {
								at := ((b*g.InH+oy+ky)*g.InW+ox+kx)*inC + c
								if got := col[row*g.K()+(ky*k+kx)*inC+c]; got != in[at] {
									t.Fatalf("inC %d: patch (%d, %d, %d) value (%d, %d, %d) = %v, want %v", inC, b, oy, ox, ky, kx, c, got, in[at])
								}
								want[at] += col[row*g.K()+(ky*k+kx)*inC+c]
							}
						}
					}
					row++
				}
			}
		}
		back := make([]float32, len(in))
		col2im(col, g, batch, back)
		for i := range back {
			if d := math.Abs(float64(back[i] - want[i])); d > 1e-5*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("inC %d: col2im value %d = %v, want %v", inC, i, back[i], want[i])
			}
		}
	}
}
