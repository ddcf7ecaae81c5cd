package bench

import (
	"fmt"

	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
)

// Gemm is one matrix product C[M x N] = op(A) * op(B) with inner dimension
// K, as a row-major BLAS Sgemm call makes it. TransA/TransB say whether A or
// B is read transposed.
type Gemm struct {
	Name           string
	M, N, K        int
	TransA, TransB bool
	// Times is how many times a step makes it (0: once): a CNN's conv
	// products are made for each chunk of nn.ConvChunk images.
	Times int
}

// FLOPs is the product's floating-point operation count in a step,
// 2*M*N*K (one multiply and one add per inner-product term) each time.
func (g Gemm) FLOPs() int64 { return 2 * int64(g.M) * int64(g.N) * int64(g.K) * int64(g.times()) }

func (g Gemm) times() int { return max(1, g.Times) }

// Calls is how many products a step of prods makes.
func Calls(prods []Gemm) int {
	n := 0
	for _, g := range prods {
		n += g.times()
	}
	return n
}

// Products lists the matrix products of one training step of spec at the
// given batch size, in the order a step runs them, a conv block's chunks
// together (the net takes each chunk through every block in turn). The
// ceiling makes each product Times times on the same buffers, and
// overwrites the output (the net adds a chunk's weight gradient into the
// batch's). For every layer l with
// input width in and output width out:
//
//	forward   Z_l  = H_l · W_l          [B x in]·[in x out]
//	backward  dW_l = H_lᵀ · dZ_l        [in x B]·[B x out]
//	backward  dH_l = dZ_l · W_lᵀ        [B x out]·[out x in]  (not for l = 0)
//
// The gradient with respect to the input batch (dH_0) is not computed:
// the input is not a variable, so the backward pass stops at dW_0. For the
// 784-800-10 MLP that is five products: X·W1, H·W2, dW2, dH, dW1. Bias
// additions, ReLU and softmax are element-wise and not counted.
//
// A CNN (package nn's im2col convolutions) adds, for each convolution c
// with P = images·outH·outW output positions and K = inC·5·5 patch
// elements, before the dense layers (whose first input is the pooled map,
// so its dH is computed too) and after them in the backward pass, for
// each chunk of nn.ConvChunk images (a last chunk of fewer is a product
// of its own):
//
//	forward   Y_c    = Col_c · W_cᵀ     [P x K]·[K x out]
//	backward  dW_c   = dY_cᵀ · Col_c    [out x P]·[P x K]
//	backward  dCol_c = dY_c · W_c       [P x out]·[out x K]  (not for c = 0)
//
// im2col, col2im and pooling are copies and comparisons, not counted: the
// ceiling is the products alone, so they are part of what the step pays
// beyond it.
func Products(spec model.Spec, batch int) ([]Gemm, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if batch <= 0 {
		return nil, fmt.Errorf("bench: batch must be positive, got %d", batch)
	}
	conv := spec.ConvLayers()
	var out []Gemm
	for c, g := range conv {
		out = chunked(out, batch, g.OutH*g.OutW, Gemm{Name: fmt.Sprintf("fwd Col%d·W%dᵀ", c, c), N: g.Out, K: g.K(), TransB: true})
	}
	dims := append(append([]int{spec.Features()}, spec.Hidden...), spec.Classes)
	layers := len(dims) - 1
	for l := 0; l < layers; l++ {
		out = append(out, Gemm{Name: fmt.Sprintf("fwd H%d·W%d", l, l), M: batch, N: dims[l+1], K: dims[l]})
	}
	for l := layers - 1; l >= 0; l-- {
		out = append(out, Gemm{Name: fmt.Sprintf("bwd dW%d=H%dᵀ·dZ%d", l, l, l), M: dims[l], N: dims[l+1], K: batch, TransA: true})
		if l > 0 || len(conv) > 0 {
			out = append(out, Gemm{Name: fmt.Sprintf("bwd dH%d=dZ%d·W%dᵀ", l, l, l), M: batch, N: dims[l], K: dims[l+1], TransB: true})
		}
	}
	for c := len(conv) - 1; c >= 0; c-- {
		g := conv[c]
		for _, ch := range chunks(batch) {
			p := ch.images * g.OutH * g.OutW
			out = append(out, Gemm{Name: fmt.Sprintf("bwd dWc%d=dY%dᵀ·Col%d", c, c, c), M: g.Out, N: g.K(), K: p, TransA: true, Times: ch.times})
			if c > 0 {
				out = append(out, Gemm{Name: fmt.Sprintf("bwd dCol%d=dY%d·W%d", c, c, c), M: p, N: g.K(), K: g.Out, Times: ch.times})
			}
		}
	}
	return out, nil
}

// chunk is a run of equal chunks of a batch's images.
type chunk struct{ images, times int }

// chunks cuts batch into chunks of nn.ConvChunk images and a last one of
// fewer, as the net takes them.
func chunks(batch int) []chunk {
	var out []chunk
	if n := batch / nn.ConvChunk; n > 0 {
		out = append(out, chunk{nn.ConvChunk, n})
	}
	if r := batch % nn.ConvChunk; r > 0 {
		out = append(out, chunk{r, 1})
	}
	return out
}

// chunked appends g, whose M is rows per image, for each run of chunks.
func chunked(out []Gemm, batch, rows int, g Gemm) []Gemm {
	for _, ch := range chunks(batch) {
		g.M, g.Times = ch.images*rows, ch.times
		out = append(out, g)
	}
	return out
}

// StepFLOPs is the total FLOP count of Products(spec, batch).
func StepFLOPs(spec model.Spec, batch int) (int64, error) {
	ps, err := Products(spec, batch)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, g := range ps {
		n += g.FLOPs()
	}
	return n, nil
}
