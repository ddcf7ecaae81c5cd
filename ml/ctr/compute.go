package ctr

import (
	"fmt"
	"math"

	gblas "gonum.org/v1/gonum/blas"

	"github.com/pstrain/pstrain/ml/embed"
)

// Compute runs the forward pass over the loaded and pulled batch and,
// for a training net, the backward pass: the dense gradients (Grads) and
// each table's combined row gradients (RowGrads). It returns the mean
// log loss.
func (n *Net) Compute() (float32, error) {
	if n.n == 0 {
		return 0, fmt.Errorf("ctr: Compute before Load")
	}
	bl := whichBLAS()
	layers := len(n.sizes) - 1
	for l := range layers {
		in, out := n.sizes[l], n.sizes[l+1]
		z := n.acts[l+1][:n.n*out]
		bl.Sgemm(gblas.NoTrans, gblas.NoTrans, n.n, out, in, 1, n.acts[l], in, n.params[2*l], out, 0, z, out)
		addBias(z, n.params[2*l+1], l+1 < layers)
	}
	loss := n.logLoss()
	if !n.train {
		return loss, nil
	}
	n.backward(bl)
	return loss, n.combineRows()
}

// addBias adds b to each row of z and, for a hidden layer, applies the
// ReLU.
func addBias(z, b []float32, relu bool) {
	w := len(b)
	for r := 0; r < len(z); r += w {
		row := z[r : r+w]
		for j, v := range b {
			x := row[j] + v
			if relu && x < 0 {
				x = 0
			}
			row[j] = x
		}
	}
}

// logLoss returns the mean of the sigmoid log loss of the logits and,
// for a training net, writes its gradient w.r.t. each logit,
// (sigmoid(z) - y) / n, into the last delta.
func (n *Net) logLoss() float32 {
	z := n.Logits()
	var dz []float32
	if n.train {
		dz = n.deltas[len(n.deltas)-1]
	}
	var sum float64
	inv := 1 / float64(n.n)
	for i, v := range z {
		x, y := float64(v), float64(n.labels[i])
		// log(1 + e^x) - x*y, written to stay finite for large |x|.
		sum += math.Max(x, 0) - x*y + math.Log1p(math.Exp(-math.Abs(x)))
		if dz != nil {
			dz[i] = float32((sigmoid(x) - y) * inv)
		}
	}
	return float32(sum * inv)
}

// backward computes the dense gradients and the input's gradient dx.
func (n *Net) backward(bl gblas.Float32Level3) {
	for l := len(n.sizes) - 2; l >= 0; l-- {
		in, out := n.sizes[l], n.sizes[l+1]
		dz := n.deltas[l][:n.n*out]
		colSum(dz, out, n.grads[2*l+1])
		bl.Sgemm(gblas.Trans, gblas.NoTrans, in, out, n.n, 1, n.acts[l], in, dz, out, 0, n.grads[2*l], out)
		// da = dz W^T: the previous layer's delta (through its ReLU) or,
		// for the first layer, the input's gradient.
		da := n.dx
		if l > 0 {
			da = n.deltas[l-1]
		}
		bl.Sgemm(gblas.NoTrans, gblas.Trans, n.n, in, out, 1, dz, out, n.params[2*l], out, 0, da, in)
		if l > 0 {
			reluMask(da[:n.n*in], n.acts[l])
		}
	}
}

// colSum writes the column sums of the rows of m (cols wide) into out.
func colSum(m []float32, cols int, out []float32) {
	clear(out)
	for r := 0; r < len(m); r += cols {
		for j, v := range m[r : r+cols] {
			out[j] += v
		}
	}
}

// reluMask zeroes the gradient where the layer's output was 0.
func reluMask(d, a []float32) {
	for i := range d {
		if a[i] <= 0 {
			d[i] = 0
		}
	}
}

// combineRows sums, per table, the input gradient of each sample's row
// into one gradient per unique key.
func (n *Net) combineRows() error {
	feat, d, in := n.sizes[0], n.spec.EmbeddingDim, n.spec.Input
	per := n.perKey[:n.n*d]
	for t := range n.tables {
		for i := range n.n {
			o := i*feat + in + t*d
			copy(per[i*d:(i+1)*d], n.dx[o:o+d])
		}
		if err := embed.Combine(n.index[t], d, per, n.rowGrads[t]); err != nil {
			return fmt.Errorf("ctr: %s: %w", n.tables[t].Name, err)
		}
	}
	return nil
}
