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

// Peek reads trained rows as they are and unseen keys as their initial
// value, without creating rows or counting sightings.
func TestLocalPeekCreatesNothing(t *testing.T) {
	l, err := NewLocal([]TableConfig{{Name: "a", Dim: 2, Seed: 4, Rule: Rule{Kind: SGD, LR: 1}, AdmitAfter: 2}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	trained := make([]float32, 2)
	_ = l.Pull(ctx, 1, "a", []uint64{7}, trained) // a first sighting: no row yet
	_ = l.Pull(ctx, 2, "a", []uint64{7}, trained) // the second: admitted
	_ = l.Push(ctx, 2, "a", []uint64{7}, []float32{1, 1})
	got := make([]float32, 4)
	if err := l.Peek("a", []uint64{7, 8}, got); err != nil {
		t.Fatal(err)
	}
	init8 := make([]float32, 2)
	InitRow(4, "a", 8, init8)
	if !slices.Equal(got, []float32{trained[0] - 1, trained[1] - 1, init8[0], init8[1]}) {
		t.Fatalf("peek %v; trained %v, initial row of 8 %v", got, trained, init8)
	}
	for range 3 {
		_ = l.Peek("a", []uint64{8}, got[:2])
	}
	if s := l.Stats()["a"]; s.Rows != 1 || s.Admissions != 1 {
		t.Fatalf("after peeks: %+v, want the one row", s)
	}
	if err := l.Peek("b", []uint64{1}, got[:2]); err == nil {
		t.Fatal("peek of a table that does not exist succeeded")
	}
}
