package ctr

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/model"
)

// fakeRows holds rows in maps and records the gradients pushed.
type fakeRows struct {
	dim    int
	rows   map[string]map[uint64][]float32
	pushed map[string]map[uint64][]float32
	r      *rand.Rand
}

func newFakeRows(dim int) *fakeRows {
	return &fakeRows{dim: dim, rows: map[string]map[uint64][]float32{}, pushed: map[string]map[uint64][]float32{}, r: rand.New(rand.NewPCG(3, 4))}
}

func (f *fakeRows) Pull(_ context.Context, _ int64, table string, keys []uint64, out []float32) error {
	if f.rows[table] == nil {
		f.rows[table] = map[uint64][]float32{}
	}
	for i, k := range keys {
		row, ok := f.rows[table][k]
		if !ok {
			row = make([]float32, f.dim)
			for j := range row {
				row[j] = float32(f.r.NormFloat64())
			}
			f.rows[table][k] = row
		}
		copy(out[i*f.dim:], row)
	}
	return nil
}

func (f *fakeRows) Push(_ context.Context, _ int64, table string, keys []uint64, grads []float32) error {
	if f.pushed[table] == nil {
		f.pushed[table] = map[uint64][]float32{}
	}
	for i, k := range keys {
		if _, dup := f.pushed[table][k]; dup {
			panic("a key pushed twice in one step")
		}
		f.pushed[table][k] = append([]float32(nil), grads[i*f.dim:(i+1)*f.dim]...)
	}
	return nil
}

// tinyBatch is 6 samples of 2 dense and 3 categorical fields, with
// duplicate keys within fields.
func tinyBatch() *ctrdata.Batch {
	b := ctrdata.NewBatch(ctrdata.Schema{Dense: 2, Cat: 3}, 6)
	b.N = 6
	r := rand.New(rand.NewPCG(1, 1))
	for i := range 6 {
		b.Labels[i] = uint8(i % 2)
		b.Dense[2*i], b.Dense[2*i+1] = float32(r.NormFloat64()), float32(r.NormFloat64())
		b.Keys[3*i] = uint64(i % 2)         // two keys, three times each
		b.Keys[3*i+1] = uint64(10 + i%3)    // three keys, twice each
		b.Keys[3*i+2] = uint64(100 + i*i%5) // some repeated
	}
	return b
}

func tinySpec() model.Spec {
	return model.Spec{Kind: model.KindCTR, Input: 2, Fields: 3, EmbeddingDim: 2, Hidden: []int{5, 3}, Classes: 1}
}

// TestGradientCheck compares the dense gradients and every combined row
// gradient with central finite differences of the loss.
func TestGradientCheck(t *testing.T) {
	spec, b := tinySpec(), tinyBatch()
	net, err := New(spec, 8, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range spec.Init(5) {
		copy(net.Params()[i], p)
	}
	// Biases away from 0, so no unit sits on its ReLU's kink (where the
	// finite difference is the mean of the two one-sided derivatives).
	r := rand.New(rand.NewPCG(9, 9))
	for v := 1; v < len(net.Params()); v += 2 {
		for j := range net.Params()[v] {
			net.Params()[v][j] = 0.1 + 0.3*float32(r.Float64())
		}
	}
	rows := newFakeRows(spec.EmbeddingDim)
	ctx := context.Background()
	if _, err := net.Step(ctx, rows, 1, b); err != nil {
		t.Fatal(err)
	}
	lossAt := func() float64 {
		if err := net.Load(b); err != nil {
			t.Fatal(err)
		}
		if err := net.Pull(ctx, rows, 1); err != nil {
			t.Fatal(err)
		}
		l, err := net.Compute()
		if err != nil {
			t.Fatal(err)
		}
		return float64(l)
	}
	const eps = 1e-3
	check := func(what string, v *float32, analytic float32) {
		old := *v
		*v = old + eps
		up := lossAt()
		*v = old - eps
		down := lossAt()
		*v = old
		num := (up - down) / (2 * eps)
		if math.Abs(num-float64(analytic)) > 2e-3+2e-2*math.Abs(num) {
			t.Errorf("%s: analytic %.6f, numeric %.6f", what, analytic, num)
		}
	}
	grads := make([][]float32, len(net.Grads()))
	for i, g := range net.Grads() {
		grads[i] = append([]float32(nil), g...)
	}
	for v, p := range net.Params() {
		for j := range p {
			check(spec.Variables()[v].Name, &p[j], grads[v][j])
		}
	}
	for _, tb := range spec.Tables() {
		if len(rows.pushed[tb.Name]) == 0 {
			t.Fatalf("%s: nothing pushed", tb.Name)
		}
		for k, g := range rows.pushed[tb.Name] {
			row := rows.rows[tb.Name][k]
			for j := range row {
				check(tb.Name, &row[j], g[j])
			}
		}
	}
}

// TestDuplicateKeysCombine: a batch of one sample repeated has each
// key's gradient the sum of its copies, so it equals the gradient of a
// batch of that sample alone (the mean of n equal losses).
func TestDuplicateKeysCombine(t *testing.T) {
	spec := tinySpec()
	one := tinyBatch()
	one.N = 1
	rep := ctrdata.NewBatch(one.Schema, 4)
	for i := range 4 {
		rep.Labels[i] = one.Labels[0]
		copy(rep.Dense[i*2:], one.Dense[:2])
		copy(rep.Keys[i*3:], one.Keys[:3])
	}
	rep.N = 4
	got := map[string][]float32{}
	for name, b := range map[string]*ctrdata.Batch{"one": one, "rep": rep} {
		net, _ := New(spec, 4, true)
		for i, p := range spec.Init(5) {
			copy(net.Params()[i], p)
		}
		rows := newFakeRows(2)
		if _, err := net.Step(context.Background(), rows, 1, b); err != nil {
			t.Fatal(err)
		}
		if len(net.Keys(0)) != 1 {
			t.Fatalf("%s: %d unique keys of C1, want 1", name, len(net.Keys(0)))
		}
		got[name] = append([]float32(nil), net.RowGrads(2)...)
	}
	for j := range got["one"] {
		if math.Abs(float64(got["one"][j]-got["rep"][j])) > 1e-6 {
			t.Errorf("row gradient %d: one sample %v, the sample four times %v", j, got["one"], got["rep"])
		}
	}
}

func TestNetRejects(t *testing.T) {
	if _, err := New(model.Spec{Input: 784, Classes: 10}, 4, true); err == nil {
		t.Error("an MLP spec built a CTR net")
	}
	net, err := New(tinySpec(), 4, false)
	if err != nil {
		t.Fatal(err)
	}
	b := tinyBatch() // 6 samples
	if err := net.Load(b); err == nil {
		t.Error("a batch larger than the net loaded")
	}
	if err := net.Load(ctrdata.NewBatch(ctrdata.Criteo, 2)); err == nil {
		t.Error("a batch of another schema loaded")
	}
	b.N = 2
	if err := net.Load(b); err != nil {
		t.Fatal(err)
	}
	if err := net.Push(context.Background(), newFakeRows(2), 1); err == nil {
		t.Error("an evaluation net pushed")
	}
}
