package embed

import (
	"context"
	"slices"
	"testing"
)

func TestLocalServesItsTablesByName(t *testing.T) {
	rule := Rule{Kind: SGD, LR: 1}
	l, err := NewLocal([]TableConfig{{Name: "a", Dim: 2, Rule: rule}, {Name: "b", Dim: 3, Rule: rule}})
	if err != nil {
		t.Fatal(err)
	}
	var rows Rows = l
	ctx := context.Background()
	out := make([]float32, 3)
	if err := rows.Pull(ctx, 1, "b", []uint64{1}, out); err != nil {
		t.Fatal(err)
	}
	if err := rows.Push(ctx, 1, "b", []uint64{1}, []float32{1, 1, 1}); err != nil {
		t.Fatal(err)
	}
	again := make([]float32, 3)
	_ = rows.Pull(ctx, 2, "b", []uint64{1}, again)
	if !slices.Equal(again, []float32{out[0] - 1, out[1] - 1, out[2] - 1}) {
		t.Fatalf("after a push of ones: %v, was %v", again, out)
	}
	if err := rows.Pull(ctx, 1, "c", []uint64{1}, out); err == nil {
		t.Fatal("pull from a table that does not exist succeeded")
	}
	if s := l.Stats(); s["a"].Rows != 0 || s["b"].Rows != 1 {
		t.Fatalf("stats %+v", s)
	}
	if _, err := NewLocal([]TableConfig{{Name: "a", Dim: 2, Rule: rule}, {Name: "a", Dim: 2, Rule: rule}}); err == nil {
		t.Fatal("a table named twice was accepted")
	}
}
