package ctr

import (
	"context"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/ml/embed"
)

// multiLocal is an embed.Local that serves calls over several tables
// (embed.MultiRows) and counts them.
type multiLocal struct {
	*embed.Local
	pulls, pushes int
}

func (m *multiLocal) PullTables(ctx context.Context, step int64, tables []embed.TableRows) error {
	m.pulls++
	for _, t := range tables {
		if err := m.Pull(ctx, step, t.Table, t.Keys, t.Rows); err != nil {
			return err
		}
	}
	return nil
}

func (m *multiLocal) PushTables(ctx context.Context, step int64, tables []embed.TableRows) error {
	m.pushes++
	for _, t := range tables {
		if err := m.Push(ctx, step, t.Table, t.Keys, t.Rows); err != nil {
			return err
		}
	}
	return nil
}

// TestStepOverMultiRows: a net whose rows serve every table in one call
// makes one pull and one push call a step, and trains the same rows and
// loss as a net calling table by table.
func TestStepOverMultiRows(t *testing.T) {
	spec, b := tinySpec(), tinyBatch()
	var cfgs []embed.TableConfig
	for _, tb := range spec.Tables() {
		cfgs = append(cfgs, embed.TableConfig{Name: tb.Name, Dim: tb.Dim, Seed: 5, Rule: embed.DefaultAdagrad(0.5)})
	}
	step := func(rows embed.Rows) ([]float32, [][]float32) {
		net, err := New(spec, 8, true)
		if err != nil {
			t.Fatal(err)
		}
		for v, p := range spec.Init(1) {
			copy(net.Params()[v], p)
		}
		var losses []float32
		for s := range int64(3) {
			loss, err := net.Step(context.Background(), rows, s, b)
			if err != nil {
				t.Fatal(err)
			}
			losses = append(losses, loss)
		}
		var got [][]float32
		for t := range spec.Fields {
			got = append(got, slices.Clone(net.RowGrads(t)))
		}
		return losses, got
	}
	one, err := embed.NewLocal(cfgs)
	if err != nil {
		t.Fatal(err)
	}
	two, err := embed.NewLocal(cfgs)
	if err != nil {
		t.Fatal(err)
	}
	m := &multiLocal{Local: two}
	wantLoss, wantGrads := step(one)
	gotLoss, gotGrads := step(m)
	if m.pulls != 3 || m.pushes != 3 {
		t.Errorf("%d pull and %d push calls over 3 steps, want one each a step", m.pulls, m.pushes)
	}
	if !slices.Equal(gotLoss, wantLoss) {
		t.Errorf("losses %v in one call a step, %v table by table", gotLoss, wantLoss)
	}
	for f := range wantGrads {
		if !slices.Equal(gotGrads[f], wantGrads[f]) {
			t.Errorf("field %d: row gradients %v, want %v", f, gotGrads[f], wantGrads[f])
		}
	}
}
