package worker

import (
	"fmt"
	"testing"

	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
)

// earlyPlan: a shard goes at the first announcement after which every
// row and variable it holds is final; the shard with row 0 never does.
func TestEarlyPlan(t *testing.T) {
	plan := func(spec model.Spec, n int) partition.Plan {
		p, err := partition.New(spec, n)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	mlp := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	two := plan(mlp, 2)
	three := plan(mlp, 3)
	for _, c := range []struct {
		name string
		p    partition.Plan
		want string
	}{
		// The default cluster: shard 1 is the first layer's rows from
		// its first one up, and everything above.
		{"default", two, fmt.Sprintf("[%d] [[1]]", two.Shards[1].Blocks[0].RowStart)},
		{"three shards", three, fmt.Sprintf("[%d %d] [[1] [2]]", three.Shards[1].Blocks[0].RowStart, three.Shards[2].Blocks[0].RowStart)},
		{"one shard", plan(mlp, 1), "[] []"},
		// A shard without the first variable is final at the first
		// announcement, with the shard of the highest rows.
		{"a shard of the layers above", partition.Plan{Shards: []partition.Shard{
			{Blocks: []partition.Block{{Var: 0, RowStart: 0, RowEnd: 4}}},
			{Blocks: []partition.Block{{Var: 0, RowStart: 4, RowEnd: 8}}},
			{Blocks: []partition.Block{{Var: 1, RowStart: 0, RowEnd: 1}, {Var: 2, RowStart: 0, RowEnd: 3}}},
		}}, "[4] [[1 2]]"},
		// Only the shard with row 0 holds the first variable: nothing
		// is announced, so nothing goes early.
		{"first variable in shard 0", partition.Plan{Shards: []partition.Shard{
			{Blocks: []partition.Block{{Var: 0, RowStart: 0, RowEnd: 8}}},
			{Blocks: []partition.Block{{Var: 1, RowStart: 0, RowEnd: 1}}},
		}}, "[] []"},
	} {
		rows, ready := earlyPlan(c.p)
		if got := fmt.Sprint(rows, ready); got != c.want {
			t.Errorf("%s: earlyPlan = %s, want %s", c.name, got, c.want)
		}
	}
	if r := two.Shards[1].Blocks[0]; r.Var != 0 || r.RowStart <= 0 {
		t.Fatalf("the default plan's shard 1 starts with %+v: the cases above assume the first layer's rows", r)
	}
}
