package worker

import (
	"slices"
	"testing"

	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/transport/compress"
)

// A shard's push residual carries what top-k left out into the next
// pushes of the same generation, and is dropped when the parameters'
// generation changes (the chief rolled the shard back or restored it).
func TestPushResidualFollowsTheGeneration(t *testing.T) {
	plan, err := partition.New(model.Spec{Input: 6, Hidden: []int{5}, Classes: 3}, 2)
	if err != nil {
		t.Fatal(err)
	}
	spec := compress.Spec{Kind: compress.TopK, Fraction: 0.1}
	c := newCompressor(compress.Setting{Push: spec, Pull: spec}, plan)
	n := plan.Shards[1].Size
	grad, zero := make([]float32, n), make([]float32, n)
	for i := range grad {
		grad[i] = float32(i + 1)
	}
	sent := func(gen int64, g []float32) []float32 {
		b, err := c.encode(1, gen, [][]float32{g})
		if err != nil {
			t.Fatal(err)
		}
		dec := make([]float32, n)
		if err := spec.Codec().Decode(dec, b); err != nil {
			t.Fatal(err)
		}
		return dec
	}
	sent(1, grad)
	if again := sent(1, zero); slices.Equal(again, zero) {
		t.Fatal("the residual sent nothing in the same generation")
	}
	if after := sent(2, zero); !slices.Equal(after, zero) {
		t.Fatalf("a new generation sent the old residual: %v", after)
	}
	if slices.ContainsFunc(c.fb[1].Residual(), func(x float32) bool { return x != 0 }) || c.fb[0] == nil {
		t.Fatal("residual left after a new generation")
	}
}
