// Package partition splits a model's variables across parameter-server
// shards so that every shard carries (nearly) the same number of bytes.
//
// The variables are laid end to end as one sequence of rows (a weight
// matrix contributes its rows, a bias vector one row), and the sequence is
// cut into S contiguous pieces at the row boundaries nearest to k/S of the
// total. Large matrices are therefore split into row blocks, and the
// imbalance is at most one row of the widest variable. Round-robin
// placement of whole variables, TensorFlow's default, puts the 784x800
// matrix on one shard and the biases on the others: the hot-shard problem.
package partition

import (
	"fmt"

	"github.com/pstrain/pstrain/ml/model"
)

// Block is rows [RowStart, RowEnd) of variable Var.
type Block struct {
	Var      int
	RowStart int
	RowEnd   int
}

// Shard is the ordered list of blocks one PS holds. Its flat buffer is the
// blocks' elements concatenated in this order.
type Shard struct {
	Blocks []Block
	Size   int // float32 elements
}

// Plan is the placement of every variable across shards.
type Plan struct {
	Vars   []model.Variable
	Shards []Shard
}

// Bounds of what build accepts. A PS builds a plan from the shard count
// and model spec an Init carries, before anything else checks them:
// without the bounds a garbage count near 2^31 made it allocate tens of
// gigabytes of shards, and garbage layer sizes had it walk 2^40 rows.
const (
	// MaxShards is the most shards a plan has: far more parameter
	// servers than a run starts.
	MaxShards = 1024
	// MaxParams is the most parameters a partitioned model has: every
	// worker holds the whole dense model, 8 GiB of float32 at this bound.
	MaxParams = 1 << 31
)

// New partitions spec's variables over n shards of equal weight. It
// fails if some shard would be empty or hold only bias vectors.
func New(spec model.Spec, n int) (Plan, error) {
	if n < 1 {
		return Plan{}, fmt.Errorf("partition: need at least one shard, got %d", n)
	}
	return build(spec, n, nil)
}

// sizeOf is the variables' total elements, refused if a variable's shape
// is negative or the total is beyond MaxParams.
func sizeOf(vars []model.Variable) (int, error) {
	total := 0
	for _, v := range vars {
		if v.Rows < 0 || v.Cols < 0 || v.Rows > MaxParams || v.Cols > MaxParams {
			return 0, fmt.Errorf("partition: variable %s of %d x %d", v.Name, v.Rows, v.Cols)
		}
		if total += v.Rows * v.Cols; total > MaxParams { // (each product is below 2^62)
			return 0, fmt.Errorf("partition: a model of more than %d parameters", MaxParams)
		}
	}
	return total, nil
}

// Weighted partitions spec's variables over len(weights) shards, shard
// i taking the share weights[i]/sum(weights) of the rows' elements
// (rebalance.go: a slower shard gets fewer). The rows stay in order, so
// every variable is still cut into contiguous row blocks; a shard's size
// is within one row of its share. Equal weights give New's plan.
func Weighted(spec model.Spec, weights []int) (Plan, error) {
	if len(weights) < 1 {
		return Plan{}, fmt.Errorf("partition: need at least one shard, got %d", len(weights))
	}
	prefix := make([]int, len(weights)+1)
	for i, w := range weights {
		if w < 1 {
			return Plan{}, fmt.Errorf("partition: shard %d's weight %d is not positive", i, w)
		}
		prefix[i+1] = prefix[i] + w
	}
	return build(spec, len(weights), prefix)
}

// build cuts spec's rows into n pieces: at k/n of the total, or, with
// prefix (the weights' prefix sums), at prefix[k]/prefix[n].
func build(spec model.Spec, n int, prefix []int) (Plan, error) {
	if n > MaxShards {
		return Plan{}, fmt.Errorf("partition: %d shards, at most %d", n, MaxShards)
	}
	vars := spec.Variables()
	total, err := sizeOf(vars)
	if err != nil {
		return Plan{}, err
	}
	at := func(k, cols int) int {
		if prefix == nil {
			return cut(total, n, k, cols)
		}
		return cut(total*prefix[k], prefix[n], 1, cols)
	}
	p := Plan{Vars: vars, Shards: make([]Shard, n)}
	cur, acc := 0, 0 // current shard, elements before the current row
	for vi, v := range vars {
		start := 0
		for r := 0; r < v.Rows; r++ {
			// Move to the next shard when this row starts past the cut
			// nearest to the current shard's share.
			for cur+1 < n && acc >= at(cur+1, v.Cols) {
				if r > start {
					p.add(cur, Block{vi, start, r}, v.Cols)
					start = r
				}
				cur++
			}
			acc += v.Cols
		}
		p.add(cur, Block{vi, start, v.Rows}, v.Cols)
	}
	if err := p.check(spec); err != nil {
		return Plan{}, err
	}
	return p, nil
}

// check fails if some shard is empty or holds only bias vectors.
func (p Plan) check(spec model.Spec) error {
	for i, s := range p.Shards {
		onlyBias := true
		for _, b := range s.Blocks {
			if !p.Vars[b.Var].Bias {
				onlyBias = false
			}
		}
		if s.Size == 0 || onlyBias {
			return fmt.Errorf("partition: model %s is too small for %d parameter servers (shard %d would hold no weights)", spec, len(p.Shards), i)
		}
	}
	return nil
}

// cut is the boundary (in elements) before which shard k-1 ends: the
// k/n share of total, rounded to the nearest row of width cols.
func cut(total, n, k, cols int) int {
	return (k*total)/n - cols/2
}

func (p *Plan) add(shard int, b Block, cols int) {
	if b.RowEnd <= b.RowStart {
		return
	}
	s := &p.Shards[shard]
	s.Blocks = append(s.Blocks, b)
	s.Size += (b.RowEnd - b.RowStart) * cols
}

// Imbalance is max/min shard size minus one (0 = perfectly even).
func (p Plan) Imbalance() float64 {
	lo, hi := p.Shards[0].Size, p.Shards[0].Size
	for _, s := range p.Shards {
		lo, hi = min(lo, s.Size), max(hi, s.Size)
	}
	return float64(hi)/float64(lo) - 1
}

// Gather copies shard s's slice of the full variables vars (in
// model.Spec.Variables order) into dst, which must have length Size.
func (p Plan) Gather(s int, vars [][]float32, dst []float32) {
	off := 0
	for _, b := range p.Shards[s].Blocks {
		cols := p.Vars[b.Var].Cols
		off += copy(dst[off:], vars[b.Var][b.RowStart*cols:b.RowEnd*cols])
	}
}

// Scatter copies shard s's flat buffer src back into the full variables.
func (p Plan) Scatter(s int, src []float32, vars [][]float32) {
	off := 0
	for _, b := range p.Shards[s].Blocks {
		cols := p.Vars[b.Var].Cols
		n := (b.RowEnd - b.RowStart) * cols
		copy(vars[b.Var][b.RowStart*cols:b.RowEnd*cols], src[off:off+n])
		off += n
	}
}

// Segments returns the slices of the full variables vars that make up
// shard s's flat buffer, in order: Gather concatenates them and Scatter
// fills them. A transport can read into them or write from them directly.
func (p Plan) Segments(s int, vars [][]float32) [][]float32 {
	out := make([][]float32, 0, len(p.Shards[s].Blocks))
	for _, b := range p.Shards[s].Blocks {
		cols := p.Vars[b.Var].Cols
		out = append(out, vars[b.Var][b.RowStart*cols:b.RowEnd*cols])
	}
	return out
}
