package nn

import (
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/model"
)

func benchStep(b *testing.B, batch int) { benchNet(b, batch, New) }

func benchNet(b *testing.B, batch int, build func(model.Spec, int, bool) (*Net, error)) {
	if err := blas.Setup(1); err != nil {
		b.Fatal(err)
	}
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	n, err := build(spec, batch, true)
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	for i, w := range spec.Init(1) {
		copy(n.Params()[i], w)
	}
	labels := make([]uint8, batch)
	for i := range labels {
		labels[i] = uint8(i % 10)
	}
	n.SetLabels(labels)
	// Pixels at random: with an input of zeros every pre-activation is
	// its bias, the ReLU's sign is always the same, and the element-wise
	// passes look cheaper than they are on images.
	r := rand.New(rand.NewPCG(1, 1))
	for i := range n.Input() {
		n.Input()[i] = r.Float32()
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := n.Step(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkStep784x800x10 measures one forward+backward pass of the
// default MLP on this binary's BLAS.
func BenchmarkStep784x800x10(b *testing.B) {
	b.Run("batch128", func(b *testing.B) { benchStep(b, 128) })
	b.Run("batch512", func(b *testing.B) { benchStep(b, 512) })
	// gorgonia's tape machine, which Step ran before the written-out pass.
	b.Run("graph-batch128", func(b *testing.B) { benchNet(b, 128, newGraph) })
}

// defaultCNN is the CNN `pstrain run --model cnn` trains by default.
func defaultCNN() model.Spec {
	return model.Spec{Kind: model.KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{16, 32}, Hidden: []int{256}, Classes: 10}
}

// cnnBenchNet is the default CNN at batch, its weights the seed-1
// initialisation, its input and labels filled in.
func cnnBenchNet(b *testing.B, batch int, train bool) *Net {
	spec := defaultCNN()
	n, err := New(spec, batch, train)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Close() })
	for i, w := range spec.Init(1) {
		copy(n.Params()[i], w)
	}
	for i := range n.Input() {
		n.Input()[i] = float32(i%255) / 255
	}
	labels := make([]uint8, batch)
	for i := range labels {
		labels[i] = uint8(i % 10)
	}
	n.SetLabels(labels)
	return n
}

// BenchmarkCNNStep measures one forward+backward pass of the default CNN
// (im2col + this binary's BLAS).
func BenchmarkCNNStep(b *testing.B) {
	if err := blas.Setup(1); err != nil {
		b.Fatal(err)
	}
	n := cnnBenchNet(b, 128, true)
	for b.Loop() {
		if _, err := n.Step(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(128*b.N)/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkCNNScoreAndTrain is the cost of one image to the chief that
// scores it (a forward pass at its evaluation batch of 1,000) and to a
// worker that trains on it (a forward and a backward pass at the
// default CNN's batch of 64 a worker): their ratio sets the chief's
// evaluation budget (chief.EvalBudgetCNN).
func BenchmarkCNNScoreAndTrain(b *testing.B) {
	if err := blas.Setup(1); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		batch int
		train bool
	}{{"score-1000", 1000, false}, {"train-64", 64, true}} {
		b.Run(c.name, func(b *testing.B) {
			n := cnnBenchNet(b, c.batch, c.train)
			for b.Loop() {
				if _, err := n.Step(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(c.batch*b.N), "µs/image")
		})
	}
}

// BenchmarkCNNStepGorgonia is the same network and batch as
// BenchmarkCNNStep built from gorgonia's Conv2d, MaxPool2D and Mul (NCHW),
// the alternative docs/models.md compares against.
func BenchmarkCNNStepGorgonia(b *testing.B) {
	if err := blas.Setup(1); err != nil {
		b.Fatal(err)
	}
	const batch = 128
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(batch, 1, 28, 28), G.WithInit(G.Uniform(0, 1)), G.WithName("x"))
	y := G.NewMatrix(g, tensor.Float32, G.WithShape(batch, 10), G.WithInit(G.Zeroes()), G.WithName("y"))
	w0 := G.NewTensor(g, tensor.Float32, 4, G.WithShape(16, 1, 5, 5), G.WithInit(G.GlorotU(1)), G.WithName("w0"))
	w1 := G.NewTensor(g, tensor.Float32, 4, G.WithShape(32, 16, 5, 5), G.WithInit(G.GlorotU(1)), G.WithName("w1"))
	w2 := G.NewMatrix(g, tensor.Float32, G.WithShape(512, 256), G.WithInit(G.GlorotU(1)), G.WithName("w2"))
	w3 := G.NewMatrix(g, tensor.Float32, G.WithShape(256, 10), G.WithInit(G.GlorotU(1)), G.WithName("w3"))
	h := x
	for _, w := range []*G.Node{w0, w1} {
		h = G.Must(G.Conv2d(h, w, tensor.Shape{5, 5}, nil, []int{1, 1}, nil))
		h = G.Must(G.Rectify(h))
		h = G.Must(G.MaxPool2D(h, tensor.Shape{2, 2}, []int{0, 0}, []int{2, 2}))
	}
	h = G.Must(G.Reshape(h, tensor.Shape{batch, 512}))
	h = G.Must(G.Rectify(G.Must(G.Mul(h, w2))))
	h = G.Must(G.Mul(h, w3))
	loss := G.Must(G.Neg(G.Must(G.Mean(G.Must(G.HadamardProd(G.Must(G.LogSoftMax(h)), y))))))
	if _, err := G.Grad(loss, w0, w1, w2, w3); err != nil {
		b.Fatal(err)
	}
	vm := G.NewTapeMachine(g)
	defer vm.Close()
	for b.Loop() {
		if err := vm.RunAll(); err != nil {
			b.Fatal(err)
		}
		vm.Reset()
	}
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "samples/s")
}
