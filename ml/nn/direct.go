package nn

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"

	"github.com/pstrain/pstrain/ml/model"
)

// direct is the MLP's forward and backward pass written out:
// the same matrix products, through the BLAS gorgonia was told to use
// (G.WhichBLAS: OpenBLAS once blas.Setup ran), and the element-wise
// passes (bias, ReLU, softmax cross-entropy and their gradients) as
// loops over buffers allocated once. Gorgonia's tape machine spent about
// a quarter of a worker's step around its products: re-dispatching every
// op, a pass per element-wise op, and ~4 MB of garbage per step. The
// graph is still built (Net's parameter buffers are its memory, and the
// tests check this pass against it).
type direct struct {
	sizes  []int       // layer widths: input, hidden..., classes
	batch  int         //
	params [][]float32 // W0, b0, W1, b1, ... (Net.params)
	grads  [][]float32 // same shapes
	acts   [][]float32 // acts[0] is the input; acts[l+1] layer l's output (after ReLU if hidden; logits last)
	deltas [][]float32 // deltas[l]: the loss's gradient w.r.t. layer l's pre-activation
	y      []float32   // one-hot targets (Net.yData)
	train  bool
	// early: see setEarlyRows.
	earlyRows []int
	early     func(row int, loss float32)
	// aheadFrom: rows aheadFrom and up of the first layer's product are
	// in acts[1] for the input and weights as they are (forwardRows);
	// sizes[0]: none.
	aheadFrom int
	// from: where the pass reads each piece of the parameters other
	// than params (readFrom); nil: params. Pieces are the first
	// variable's blocks (split at earlyRows: from[0][i] is block i) and
	// every other variable whole (from[v][0]).
	from [][][]float32
}

// setEarlyRows has the backward pass compute the first layer's weight
// gradient in row blocks split at rows (ascending, within the layer's
// input width), the last block first, and call ready(r, loss) after each
// block but the one of row 0: then rows r and up of that gradient, and
// every other variable's, are final. nil rows: one product, no calls. It
// reports false (and changes nothing) for rows out of order or range, or
// a net without gradients.
func (d *direct) setEarlyRows(rows []int, ready func(row int, loss float32)) bool {
	if len(rows) == 0 || ready == nil {
		d.own() // (the pieces change)
		d.earlyRows, d.early = nil, nil
		d.resetFrom()
		d.forget()
		return true
	}
	if !d.train || rows[0] <= 0 || rows[len(rows)-1] >= d.sizes[0] || !slices.IsSorted(rows) || len(slices.Compact(slices.Clone(rows))) != len(rows) {
		return false
	}
	d.own()
	d.earlyRows, d.early = slices.Clone(rows), ready
	d.resetFrom()
	d.forget()
	return true
}

// forwardRows computes, ahead of the next step, the part of its first
// product that reads only the input and rows r and up of the first
// weight variable: r must be one of the early rows. It reports false
// (computing nothing) for any other r. The step uses what it computed,
// so the caller must call forget if the input or those rows change
// before the step.
func (d *direct) forwardRows(r int) bool {
	if _, ok := slices.BinarySearch(d.earlyRows, r); !ok {
		return false
	}
	d.firstProduct(G.WhichBLAS(), r)
	return true
}

// forget drops what forwardRows computed.
func (d *direct) forget() { d.aheadFrom = d.sizes[0] }

// firstProduct computes rows r and up of the first layer's product
// x W0, on top of what is already computed (rows d.aheadFrom and up): rows
// i of W0 meet column i of x, so a block of rows is a product over a
// block of x's columns, added into the output. With early rows the
// blocks are theirs, the last first, whether computed ahead or in the
// step, so a step's result does not depend on how much of it was done
// ahead (the sums are added in the same order).
func (d *direct) firstProduct(bl blas.Float32Level3, r int) {
	in, out := d.sizes[0], d.sizes[1]
	x, z := d.acts[0], d.acts[1]
	hi := d.aheadFrom
	for i := len(d.earlyRows); i >= 0 && hi > r; i-- {
		lo := 0
		if i > 0 {
			lo = d.earlyRows[i-1]
		}
		if lo >= hi {
			continue
		}
		beta := float32(1)
		if hi == in {
			beta = 0 // the first block overwrites the last step's sums
		}
		bl.Sgemm(blas.NoTrans, blas.NoTrans, d.batch, out, hi-lo, 1, x[lo:], in, d.block(i, lo, hi), out, beta, z, out)
		hi = lo
	}
	d.aheadFrom = hi
}

// param is variable v (not the first) as the pass reads it.
func (d *direct) param(v int) []float32 {
	if f := d.from[v][0]; f != nil {
		return f
	}
	return d.params[v]
}

// block is rows lo to hi of the first variable, block i of its pieces,
// as the pass reads them.
func (d *direct) block(i, lo, hi int) []float32 {
	if f := d.from[0][i]; f != nil {
		return f
	}
	out := d.sizes[1]
	return d.params[0][lo*out : hi*out]
}

// piece is the index in from[v] of the piece of variable v that starts
// at row, and its length; i -1: no piece starts there.
func (d *direct) piece(v, row int) (i, n int) {
	if v > 0 {
		if row != 0 {
			return -1, 0
		}
		return 0, len(d.params[v])
	}
	if row != 0 {
		j, ok := slices.BinarySearch(d.earlyRows, row)
		if !ok {
			return -1, 0
		}
		i = j + 1
	}
	end := d.sizes[0]
	if i < len(d.earlyRows) {
		end = d.earlyRows[i]
	}
	return i, (end - row) * d.sizes[1]
}

// readFrom has the pass read the piece of variable v that starts at row
// from data (of the piece's length), or from params again if data is
// nil. It reports false, changing nothing, if no piece starts at row or
// data's length is not the piece's.
func (d *direct) readFrom(v, row int, data []float32) bool {
	i, n := d.piece(v, row)
	if i < 0 || (data != nil && len(data) != n) {
		return false
	}
	d.from[v][i] = data
	return true
}

// own copies every piece read from elsewhere into params and reads it
// from params again.
func (d *direct) own() {
	for v, pieces := range d.from {
		for i, f := range pieces {
			if f == nil {
				continue
			}
			start := 0
			if v == 0 && i > 0 {
				start = d.earlyRows[i-1] * d.sizes[1]
			}
			copy(d.params[v][start:], f)
			pieces[i] = nil
		}
	}
}

// resetFrom sizes from for the pieces of the early rows (reading every
// piece from params).
func (d *direct) resetFrom() {
	d.from = make([][][]float32, len(d.params))
	for v := range d.from {
		d.from[v] = make([][]float32, 1)
	}
	d.from[0] = make([][]float32, len(d.earlyRows)+1)
}

func newDirect(spec model.Spec, batch int, train bool, x, y []float32, params [][]float32) *direct {
	sizes := append(append([]int{spec.Input}, spec.Hidden...), spec.Classes)
	d := &direct{sizes: sizes, batch: batch, params: params, y: y, train: train, aheadFrom: spec.Input}
	d.resetFrom()
	d.acts = append(d.acts, x)
	for l := 1; l < len(sizes); l++ {
		d.acts = append(d.acts, make([]float32, batch*sizes[l]))
		if train {
			d.deltas = append(d.deltas, make([]float32, batch*sizes[l]))
		}
	}
	if train {
		for _, p := range params {
			d.grads = append(d.grads, make([]float32, len(p)))
		}
	}
	return d
}

// logits is the last layer's output of the last step.
func (d *direct) logits() []float32 { return d.acts[len(d.acts)-1] }

// step runs the forward pass, the loss, and for a training net the
// backward pass; it returns the mean softmax cross-entropy.
func (d *direct) step() float32 {
	bl := G.WhichBLAS()
	layers := len(d.sizes) - 1
	for l := range layers {
		in, out := d.sizes[l], d.sizes[l+1]
		z := d.acts[l+1]
		if l == 0 {
			d.firstProduct(bl, 0)
			d.forget() // the next step's input and weights are new
		} else {
			bl.Sgemm(blas.NoTrans, blas.NoTrans, d.batch, out, in, 1, d.acts[l], in, d.param(2*l), out, 0, z, out)
		}
		addBias(z, d.param(2*l+1), l+1 < layers)
	}
	loss := softmaxXent(d.logits(), d.y, d.batch, d.sizes[layers], d.deltasOrNil(layers-1))
	if !d.train {
		return loss
	}
	for l := layers - 1; l >= 0; l-- {
		in, out := d.sizes[l], d.sizes[l+1]
		dz := d.deltas[l]
		// dW = a^T dz, db = the column sums of dz.
		colSum(dz, out, d.grads[2*l+1])
		if l == 0 {
			d.firstWeights(bl, dz, loss)
			break // nothing reads the input's gradient
		}
		bl.Sgemm(blas.Trans, blas.NoTrans, in, out, d.batch, 1, d.acts[l], in, dz, out, 0, d.grads[2*l], out)
		// da = dz W^T, then through the ReLU of layer l-1 (whose output
		// is acts[l]).
		prev := d.deltas[l-1]
		bl.Sgemm(blas.NoTrans, blas.Trans, d.batch, in, out, 1, dz, out, d.param(2*l), out, 0, prev, in)
		reluMask(prev, d.acts[l])
	}
	return loss
}

// firstWeights computes the first layer's weight gradient a^T dz: rows
// i of it are input i's, so a block of rows is the product over a block
// of a's columns. With early rows the blocks go last first, each
// announced as it is done (setEarlyRows), so a worker can send the
// shards that hold them while the rest is computed.
func (d *direct) firstWeights(bl blas.Float32Level3, dz []float32, loss float32) {
	in, out := d.sizes[0], d.sizes[1]
	a, g := d.acts[0], d.grads[0]
	hi := in
	for i := len(d.earlyRows) - 1; i >= 0; i-- {
		r := d.earlyRows[i]
		bl.Sgemm(blas.Trans, blas.NoTrans, hi-r, out, d.batch, 1, a[r:], in, dz, out, 0, g[r*out:], out)
		d.early(r, loss)
		hi = r
	}
	bl.Sgemm(blas.Trans, blas.NoTrans, hi, out, d.batch, 1, a, in, dz, out, 0, g, out)
}

func (d *direct) deltasOrNil(l int) []float32 {
	if !d.train {
		return nil
	}
	return d.deltas[l]
}

// softmaxXent returns the mean over the rows of -sum(y log softmax(z))
// and, if dz is not nil, writes its gradient w.r.t. z: (softmax(z) - y) /
// rows, 0 for a row without a label.
func softmaxXent(z, y []float32, rows, cols int, dz []float32) float32 {
	var total float64
	inv := float32(1 / float64(rows))
	for r := range rows {
		zr, yr := z[r*cols:(r+1)*cols], y[r*cols:(r+1)*cols]
		if !labelled(yr) {
			// A row without a label (a short batch's padding) adds
			// nothing to the loss and nothing to the gradient, as in the
			// graph (whose gradient is softmax*sum(y) - y) and the CNN.
			if dz != nil {
				clear(dz[r*cols : (r+1)*cols])
			}
			continue
		}
		m := zr[0]
		for _, v := range zr[1:] {
			m = max(m, v)
		}
		var s float64
		for _, v := range zr {
			s += math.Exp(float64(v - m))
		}
		logS := math.Log(s)
		for j, v := range zr {
			logp := float64(v-m) - logS
			total -= float64(yr[j]) * logp
			if dz != nil {
				dz[r*cols+j] = (float32(math.Exp(logp)) - yr[j]) * inv
			}
		}
	}
	return float32(total / float64(rows))
}

// labelled says whether the one-hot target row y names a class.
func labelled(y []float32) bool {
	for _, v := range y {
		if v != 0 {
			return true
		}
	}
	return false
}
