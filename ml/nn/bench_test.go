package nn

import (
	"testing"

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
