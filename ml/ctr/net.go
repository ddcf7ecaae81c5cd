// Package ctr runs the click-through-rate model (model.Spec of kind
// ctr): each sample's categorical keys look up rows of their fields'
// embedding tables, the rows are concatenated after the dense features,
// and dense layers (ReLU between them) end in one logit, trained with
// the log loss of its sigmoid.
//
// A Net does a batch in three steps a worker times apart: Pull (the
// unique keys of each table, deduplicated, read through an embed.Rows),
// Compute (forward and backward: the dense layers' gradient in
// Grads(), in model.Spec.Variables() order like package nn's, and one
// combined gradient per unique key of each table), and Push (those row
// gradients, through the same embed.Rows). Step does all three. The
// dense weights are the caller's to keep (Params(), written in place
// before Compute), as for an MLP; the rows live wherever the Rows puts
// them: embed.Local in one process, the PS shards in a cluster.
package ctr

import (
	"context"
	"fmt"
	"math"

	gblas "gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"

	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
)

// Net is the CTR model's pass for batches of up to a fixed size. It is
// not safe for concurrent use.
type Net struct {
	spec   model.Spec
	batch  int
	train  bool
	tables []model.Table
	sizes  []int // layer widths: features, hidden..., 1

	params, grads [][]float32

	n      int         // samples in the current batch
	labels []float32   // [n]
	acts   [][]float32 // acts[0] the input [batch x features]; acts[l+1] layer l's output
	deltas [][]float32 // deltas[l]: the loss's gradient w.r.t. layer l's pre-activation
	dx     []float32   // the loss's gradient w.r.t. the input

	dedup    embed.Deduper
	keys     []uint64    // one field's keys of the batch (scratch)
	uniq     [][]uint64  // per table: its unique keys
	index    [][]int32   // per table: each sample's index in uniq
	rows     [][]float32 // per table: the unique keys' rows
	rowGrads [][]float32 // per table: the unique keys' combined gradients
	perKey   []float32   // one field's gradients per sample (scratch)
}

// New builds the pass of a CTR spec for batches of up to batch samples;
// with train, Compute also computes gradients.
func New(spec model.Spec, batch int, train bool) (*Net, error) {
	if !spec.IsCTR() {
		return nil, fmt.Errorf("ctr: a %s spec is not a CTR model", spec.KindName())
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if batch <= 0 {
		return nil, fmt.Errorf("ctr: batch must be positive, got %d", batch)
	}
	n := &Net{spec: spec, batch: batch, train: train, tables: spec.Tables()}
	n.sizes = append(append([]int{spec.Features()}, spec.Hidden...), 1)
	for _, v := range spec.Variables() {
		n.params = append(n.params, make([]float32, v.Size()))
		if train {
			n.grads = append(n.grads, make([]float32, v.Size()))
		}
	}
	n.labels = make([]float32, batch)
	for _, w := range n.sizes {
		n.acts = append(n.acts, make([]float32, batch*w))
		if train {
			n.deltas = append(n.deltas, make([]float32, batch*w))
		}
	}
	if train {
		n.dx = n.deltas[0]
		n.deltas = n.deltas[1:]
		n.perKey = make([]float32, batch*spec.EmbeddingDim)
	}
	nt := len(n.tables)
	n.uniq, n.index, n.rows, n.rowGrads = make([][]uint64, nt), make([][]int32, nt), make([][]float32, nt), make([][]float32, nt)
	return n, nil
}

// Spec is the model the net runs.
func (n *Net) Spec() model.Spec { return n.spec }

// Batch is the most samples a batch may hold.
func (n *Net) Batch() int { return n.batch }

// Params returns the dense layers' weights in model.Spec.Variables()
// order: write them in place before Compute.
func (n *Net) Params() [][]float32 { return n.params }

// Grads returns the dense layers' gradients of the last Compute (of the
// batch's mean loss), in Params' order; nil for a net without training.
func (n *Net) Grads() [][]float32 { return n.grads }

// Tables lists the embedding tables, in field order.
func (n *Net) Tables() []model.Table { return n.tables }

// Keys is table t's unique keys in the current batch, in the order first
// seen; RowGrads(t) holds their gradients after Compute.
func (n *Net) Keys(t int) []uint64 { return n.uniq[t] }

// RowGrads is table t's combined gradient per unique key of the last
// Compute (len(Keys(t)) rows of the embedding dimension).
func (n *Net) RowGrads(t int) []float32 { return n.rowGrads[t] }

// Load takes a batch: its labels and dense features, and each field's
// keys deduplicated. b's schema must match the spec.
func (n *Net) Load(b *ctrdata.Batch) error {
	s := b.Schema
	if s.Dense != n.spec.Input || s.Cat != n.spec.Fields {
		return fmt.Errorf("ctr: a batch of %d dense and %d categorical fields for a model of %d and %d", s.Dense, s.Cat, n.spec.Input, n.spec.Fields)
	}
	if b.N < 1 || b.N > n.batch {
		return fmt.Errorf("ctr: a batch of %d samples for a net of up to %d", b.N, n.batch)
	}
	n.n = b.N
	feat, d := n.sizes[0], n.spec.EmbeddingDim
	x := n.acts[0]
	for i := range b.N {
		n.labels[i] = float32(b.Labels[i])
		copy(x[i*feat:i*feat+s.Dense], b.Dense[i*s.Dense:(i+1)*s.Dense])
	}
	for t := range n.tables {
		n.keys = n.keys[:0]
		for i := range b.N {
			n.keys = append(n.keys, b.Key(i, t))
		}
		n.uniq[t], n.index[t] = n.dedup.Dedup(n.keys, n.uniq[t], n.index[t])
		n.rows[t] = grow(n.rows[t], len(n.uniq[t])*d)
		n.rowGrads[t] = grow(n.rowGrads[t], len(n.uniq[t])*d)
	}
	return nil
}

// grow returns buf resized to n values, reallocated only if too small.
func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n, n+n/4)
	}
	return buf[:n]
}

// Pull reads every table's rows of the batch's unique keys through rows
// and places them in the input.
func (n *Net) Pull(ctx context.Context, rows embed.Rows, step int64) error {
	if m, ok := rows.(embed.MultiRows); ok {
		if err := m.PullTables(ctx, step, n.tableRows(n.rows)); err != nil {
			return fmt.Errorf("ctr: pulling the rows: %w", err)
		}
		n.scatterRows()
		return nil
	}
	for t, tb := range n.tables {
		if err := rows.Pull(ctx, step, tb.Name, n.uniq[t], n.rows[t]); err != nil {
			return fmt.Errorf("ctr: pulling %s: %w", tb.Name, err)
		}
	}
	n.scatterRows()
	return nil
}

// scatterRows copies each sample's rows into its input.
func (n *Net) scatterRows() {
	feat, d, in := n.sizes[0], n.spec.EmbeddingDim, n.spec.Input
	x := n.acts[0]
	for t := range n.tables {
		rows, index := n.rows[t], n.index[t]
		for i := range n.n {
			o := i*feat + in + t*d
			r := int(index[i]) * d
			copy(x[o:o+d], rows[r:r+d])
		}
	}
}

// Push sends every table's combined row gradients of the last Compute
// through rows.
func (n *Net) Push(ctx context.Context, rows embed.Rows, step int64) error {
	if !n.train {
		return fmt.Errorf("ctr: a net without training has no gradients to push")
	}
	if m, ok := rows.(embed.MultiRows); ok {
		if err := m.PushTables(ctx, step, n.tableRows(n.rowGrads)); err != nil {
			return fmt.Errorf("ctr: pushing the row gradients: %w", err)
		}
		return nil
	}
	for t, tb := range n.tables {
		if err := rows.Push(ctx, step, tb.Name, n.uniq[t], n.rowGrads[t]); err != nil {
			return fmt.Errorf("ctr: pushing %s: %w", tb.Name, err)
		}
	}
	return nil
}

// RowGradients is the last step's gradients of its rows, by table (the
// unique keys and a row of gradients each): what Push sends, for a
// caller that sends them itself. They are the net's buffers, valid until
// its next step; a net without training has none (nil).
func (n *Net) RowGradients() []embed.TableRows {
	if !n.train {
		return nil
	}
	return n.tableRows(n.rowGrads)
}

// tableRows is every table's unique keys with vals[t], for a call
// over all the tables (embed.MultiRows).
func (n *Net) tableRows(vals [][]float32) []embed.TableRows {
	out := make([]embed.TableRows, len(n.tables))
	for t, tb := range n.tables {
		out[t] = embed.TableRows{Table: tb.Name, Keys: n.uniq[t], Rows: vals[t]}
	}
	return out
}

// Step is Load, Pull, Compute and (training) Push of one batch; it
// returns the batch's mean log loss.
func (n *Net) Step(ctx context.Context, rows embed.Rows, step int64, b *ctrdata.Batch) (float32, error) {
	if err := n.Load(b); err != nil {
		return 0, err
	}
	if err := n.Pull(ctx, rows, step); err != nil {
		return 0, err
	}
	loss, err := n.Compute()
	if err != nil || !n.train {
		return loss, err
	}
	return loss, n.Push(ctx, rows, step)
}

// Logits is the last Compute's logit per sample (its first Load's N).
func (n *Net) Logits() []float32 { return n.acts[len(n.acts)-1][:n.n] }

// Probs writes the last Compute's click probabilities into out (at
// least N values) and returns them.
func (n *Net) Probs(out []float32) []float32 {
	out = out[:n.n]
	for i, z := range n.Logits() {
		out[i] = float32(sigmoid(float64(z)))
	}
	return out
}

func sigmoid(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

// whichBLAS is the BLAS gorgonia was told to use (OpenBLAS once blas.Setup
// ran), as package nn's passes.
func whichBLAS() gblas.Float32Level3 { return G.WhichBLAS() }
