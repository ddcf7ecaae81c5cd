package nn

import (
	"fmt"
	"math"

	gblas "gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	G "gorgonia.org/gorgonia"

	"github.com/pstrain/pstrain/ml/conv"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/vec"
)

// cnnNet is a LeNet-style CNN (model.Spec with Kind cnn) written out by
// hand: every feature map is NHWC ([batch, height, width, channels],
// channels innermost), a convolution is im2col followed by one Sgemm (a
// first block of one input channel, where package conv can, a direct
// convolution), and the dense layers are one Sgemm each. Sgemm is the
// BLAS gorgonia uses (package blas installs OpenBLAS), so the CNN and the
// MLP multiply on the same library. docs/models.md has the shapes and
// why not gorgonia's Conv2d.
type cnnNet struct {
	spec   model.Spec
	batch  int
	train  bool
	gemm   gblas.Float32Level3
	layers []model.ConvLayer
	params [][]float32 // model.Spec.Variables order
	grads  [][]float32 // same shapes; nil for an eval net
	x      []float32   // [batch, H, W, C]
	labels []int       // -1: no label (row contributes nothing)
	// chunk is how many images the conv blocks take at a time
	// (ConvChunk), so that a block's patches (col) and maps (out, and in
	// training their gradients) are a chunk's: they fit in a core's cache
	// where the whole batch's did not (the default CNN's second block
	// has 13 MB of patches at 128 images), and evaluating in batches of
	// 1000 does not hold 1000 images' patches and maps (about 150 MiB).
	// The pooled maps are kept for the whole batch: in training every
	// block's (the backward pass reads them, and makes each chunk's
	// patches again), in an eval net the last block's (the dense
	// layers' input).
	chunk int
	conv  []convBufs
	dense []denseBufs
	prob  []float32 // softmax of the logits, [batch, classes]
	// direct is whether the first block convolves directly (package
	// conv: one input channel, a channel count conv.Fast takes) instead
	// of im2col and a product; wt is its kernel tap by tap [25, Out],
	// dwt the gradient of that (train).
	direct  bool
	wt, dwt []float32
}

// convBufs is one convolution block's memory. P = chunk*OutH*OutW;
// images is the batch when the net trains or the block is the last,
// else the chunk.
type convBufs struct {
	col   []float32 // [P, K] im2col patches of the block's input (nil: the block convolves directly)
	out   []float32 // [P, Out] the convolution without its bias
	pool  []float32 // [images*PoolH*PoolW, Out] ReLU(2x2 max of out + bias)
	arg   []int32   // [images*PoolH*PoolW, Out] index into its chunk's out of each pool element's maximum
	dOut  []float32 // train: dLoss/d(conv + bias), [P, Out]
	dCol  []float32 // train, not the first block: dLoss/dcol, [P, K]
	dPool []float32 // train: dLoss/dpool, [batch*PoolH*PoolW, Out]
}

// denseBufs is one dense layer's memory.
type denseBufs struct {
	in, out int
	z       []float32 // [batch, out] activations (ReLU applied but on the last)
	dz      []float32 // train: dLoss/d(pre-activation)
}

// ConvChunk is how many images a CNN's conv blocks take at a time
// (BenchmarkCNNStep and BenchmarkCNNScoreAndTrain: 8 trained as fast as
// 4 and 16, and scored as fast as 32).
const ConvChunk = 8

func newCNN(spec model.Spec, batch int, train bool) *cnnNet {
	n := &cnnNet{spec: spec, batch: batch, train: train, layers: spec.ConvLayers(), gemm: sgemmImpl(), chunk: min(batch, ConvChunk)}
	for _, v := range spec.Variables() {
		n.params = append(n.params, make([]float32, v.Size()))
		if train {
			n.grads = append(n.grads, make([]float32, v.Size()))
		}
	}
	n.x = make([]float32, batch*spec.Input)
	n.labels = make([]int, batch)
	for i, l := range n.layers {
		p, pooled := n.chunk*l.OutH*l.OutW, l.PoolH*l.PoolW*l.Out
		images := n.chunk
		if train || i == len(n.layers)-1 {
			images = batch
		}
		c := convBufs{
			out:  make([]float32, p*l.Out),
			pool: make([]float32, images*pooled),
			arg:  make([]int32, images*pooled),
		}
		if i == 0 && l.InC == 1 && conv.Fast(l.Out) && model.KernelSize*model.KernelSize == conv.Taps {
			n.direct, n.wt = true, make([]float32, conv.Taps*l.Out)
			if train {
				n.dwt = make([]float32, len(n.wt))
			}
		} else {
			c.col = make([]float32, p*l.K())
		}
		if train {
			c.dOut = make([]float32, len(c.out))
			c.dPool = make([]float32, len(c.pool))
			if i > 0 {
				c.dCol = make([]float32, len(c.col))
			}
		}
		n.conv = append(n.conv, c)
	}
	dims := append(append([]int{spec.Features()}, spec.Hidden...), spec.Classes)
	for l := 0; l+1 < len(dims); l++ {
		d := denseBufs{in: dims[l], out: dims[l+1], z: make([]float32, batch*dims[l+1])}
		if train {
			d.dz = make([]float32, len(d.z))
		}
		n.dense = append(n.dense, d)
	}
	n.prob = make([]float32, batch*spec.Classes)
	return n
}

// sgemmImpl is the single-precision BLAS gorgonia is set to use (package
// blas sets it), or gonum's.
func sgemmImpl() gblas.Float32Level3 {
	if b, ok := G.WhichBLAS().(gblas.Float32Level3); ok {
		return b
	}
	return gonum.Implementation{}
}

func (n *cnnNet) Params() [][]float32 { return n.params }
func (n *cnnNet) Input() []float32    { return n.x }
func (n *cnnNet) Close() error        { return nil }

func (n *cnnNet) Logits() []float32 { return n.dense[len(n.dense)-1].z }

func (n *cnnNet) SetLabels(labels []uint8) {
	for i := range n.labels {
		n.labels[i] = -1
		if i < len(labels) {
			n.labels[i] = int(labels[i])
		}
	}
}

func (n *cnnNet) Grads() ([][]float32, error) {
	if !n.train {
		return nil, fmt.Errorf("nn: net was built without gradients")
	}
	return n.grads, nil
}

func (n *cnnNet) Step() (float32, error) {
	n.forward()
	loss := n.softmaxLoss() // NaN or Inf is reported as is, like the MLP's: callers decide
	if n.train {
		n.backward()
	}
	return loss, nil
}

// wIndex and bIndex are the positions in Params of conv block l's kernel
// and bias; dense layer l's follow all the conv blocks'.
func wIndex(l int) int { return 2 * l }
func bIndex(l int) int { return 2*l + 1 }

func (n *cnnNet) forward() {
	if n.direct {
		transpose(n.params[wIndex(0)], n.layers[0].Out, conv.Taps, n.wt)
	}
	for b := 0; b < n.batch; b += n.chunk {
		m := min(n.chunk, n.batch-b)
		in := n.x[b*n.spec.Input : (b+m)*n.spec.Input]
		for l, g := range n.layers {
			c := &n.conv[l]
			if l == 0 && n.direct {
				n.convolveDirect(in, m)
			} else {
				im2col(in, g, m, c.col)
				n.gemm.Sgemm(gblas.NoTrans, gblas.Trans, m*g.OutH*g.OutW, g.Out, g.K(), 1, c.col, g.K(), n.params[wIndex(l)], g.K(), 0, c.out, g.Out)
			}
			pool, arg := n.pooled(l, b, m)
			maxPool(c.out, n.params[bIndex(l)], g, m, pool, arg)
			in = pool
		}
	}
	in := n.conv[len(n.conv)-1].pool
	off := len(n.layers)
	for l := range n.dense {
		d := &n.dense[l]
		n.gemm.Sgemm(gblas.NoTrans, gblas.NoTrans, n.batch, d.out, d.in, 1, in, d.in, n.params[wIndex(off+l)], d.out, 0, d.z, d.out)
		addBias(d.z, n.params[bIndex(off+l)], l+1 < len(n.dense))
		in = d.z
	}
}

// pooled is where block l's pooled map and its maxima's positions for
// the m images from image b go: their place in the whole batch's, or
// the chunk's buffers of an eval net's block before the last.
func (n *cnnNet) pooled(l, b, m int) ([]float32, []int32) {
	g, c := n.layers[l], &n.conv[l]
	size := g.PoolH * g.PoolW * g.Out
	if len(c.pool) < n.batch*size {
		b = 0
	}
	return c.pool[b*size : (b+m)*size], c.arg[b*size : (b+m)*size]
}

// softmaxLoss fills prob and returns the mean cross-entropy over the
// labelled rows, divided by the whole batch as the MLP's graph does.
func (n *cnnNet) softmaxLoss() float32 {
	k := n.spec.Classes
	z := n.Logits()
	var loss float64
	for i := 0; i < n.batch; i++ {
		row, p := z[i*k:(i+1)*k], n.prob[i*k:(i+1)*k]
		hi := row[0]
		for _, v := range row {
			hi = max(hi, v)
		}
		var sum float64
		for j, v := range row {
			e := math.Exp(float64(v - hi))
			p[j] = float32(e)
			sum += e
		}
		for j := range p {
			p[j] = float32(float64(p[j]) / sum)
		}
		if y := n.labels[i]; y >= 0 {
			loss -= float64(row[y]-hi) - math.Log(sum)
		}
	}
	return float32(loss / float64(n.batch))
}

func (n *cnnNet) backward() {
	k, off := n.spec.Classes, len(n.layers)
	last := &n.dense[len(n.dense)-1]
	scale := float32(1 / float64(n.batch))
	for i := 0; i < n.batch; i++ {
		dz, p := last.dz[i*k:(i+1)*k], n.prob[i*k:(i+1)*k]
		if n.labels[i] < 0 {
			clear(dz)
			continue
		}
		for j := range dz {
			dz[j] = p[j] * scale
		}
		dz[n.labels[i]] -= scale
	}
	for l := len(n.dense) - 1; l >= 0; l-- {
		d := &n.dense[l]
		in, dIn := n.denseInput(l)
		n.gemm.Sgemm(gblas.Trans, gblas.NoTrans, d.in, d.out, n.batch, 1, in, d.in, d.dz, d.out, 0, n.grads[wIndex(off+l)], d.out)
		colSum(d.dz, d.out, n.grads[bIndex(off+l)])
		if dIn == nil {
			continue
		}
		n.gemm.Sgemm(gblas.NoTrans, gblas.Trans, n.batch, d.in, d.out, 1, d.dz, d.out, n.params[wIndex(off+l)], d.out, 0, dIn, d.in)
		if l > 0 {
			reluMask(dIn, in) // in is the previous layer's ReLU output
		}
	}
	n.convBackward()
}

// convBackward is the conv blocks' backward pass, chunk by chunk: each
// chunk's patches are made again (im2col) for its blocks' weight
// gradients (a first block that convolves directly sums its kernel's
// gradient from the chunk's images instead), which sum over the chunks,
// as do the biases'.
func (n *cnnNet) convBackward() {
	for l := range n.layers {
		clear(n.grads[bIndex(l)]) // (unpool adds into it)
	}
	if n.direct {
		clear(n.dwt)
		defer transpose(n.dwt, conv.Taps, n.layers[0].Out, n.grads[wIndex(0)])
	}
	for b := 0; b < n.batch; b += n.chunk {
		m, beta := min(n.chunk, n.batch-b), float32(0)
		if b > 0 {
			beta = 1
		}
		for l := len(n.layers) - 1; l >= 0; l-- {
			g, c := n.layers[l], &n.conv[l]
			p, size := m*g.OutH*g.OutW, g.PoolH*g.PoolW*g.Out
			pool, arg := n.pooled(l, b, m)
			unpool(c.dPool[b*size:(b+m)*size], arg, pool, g, m, c.dOut, n.grads[bIndex(l)])
			if l == 0 && n.direct {
				n.kernelGradDirect(n.convInput(0, b, m), m)
				continue
			}
			im2col(n.convInput(l, b, m), g, m, c.col)
			n.gemm.Sgemm(gblas.Trans, gblas.NoTrans, g.Out, g.K(), p, 1, c.dOut, g.Out, c.col, g.K(), beta, n.grads[wIndex(l)], g.K())
			if l == 0 {
				continue // nothing wants the gradient of the images
			}
			prev := n.layers[l-1]
			prevSize := prev.PoolH * prev.PoolW * prev.Out
			n.gemm.Sgemm(gblas.NoTrans, gblas.NoTrans, p, g.K(), g.Out, 1, c.dOut, g.Out, n.params[wIndex(l)], g.K(), 0, c.dCol, g.K())
			col2im(c.dCol, g, m, n.conv[l-1].dPool[b*prevSize:(b+m)*prevSize])
		}
	}
}

// convolveDirect is the first block's convolution of the m images in
// (one channel) into its out, an output row at a time (conv.Row).
func (n *cnnNet) convolveDirect(in []float32, m int) {
	g, out := n.layers[0], n.conv[0].out
	row := g.OutW * g.Out
	for b := range m {
		for oy := range g.OutH {
			conv.Row(in[(b*g.InH+oy)*g.InW:], g.InW, n.wt, out[(b*g.OutH+oy)*row:][:row], g.Out)
		}
	}
}

// kernelGradDirect adds the first block's kernel gradient from the m
// images in and their dOut into dwt (conv.GradRow).
func (n *cnnNet) kernelGradDirect(in []float32, m int) {
	g, dOut := n.layers[0], n.conv[0].dOut
	row := g.OutW * g.Out
	for b := range m {
		for oy := range g.OutH {
			conv.GradRow(in[(b*g.InH+oy)*g.InW:], g.InW, dOut[(b*g.OutH+oy)*row:][:row], n.dwt, g.Out)
		}
	}
}

// transpose writes the [rows, cols] matrix a into dst as [cols, rows].
func transpose(a []float32, rows, cols int, dst []float32) {
	for r := range rows {
		for c, v := range a[r*cols : (r+1)*cols] {
			dst[c*rows+r] = v
		}
	}
}

// convInput is block l's input for the m images from image b: the
// images, or the previous block's pooled map.
func (n *cnnNet) convInput(l, b, m int) []float32 {
	if l == 0 {
		return n.x[b*n.spec.Input : (b+m)*n.spec.Input]
	}
	pool, _ := n.pooled(l-1, b, m)
	return pool
}

// denseInput is dense layer l's input and the buffer its gradient
// goes to: the previous dense layer's, or the last conv block's pooled map.
func (n *cnnNet) denseInput(l int) (in, dIn []float32) {
	if l > 0 {
		return n.dense[l-1].z, n.dense[l-1].dz
	}
	last := len(n.conv) - 1
	return n.conv[last].pool, n.conv[last].dPool
}

// im2col writes, for every output position of block g, the KxK patch of in
// under it: row (b, oy, ox) of col is the patch in (ky, kx, c) order, which
// is the order of a kernel row. In NHWC each kernel row (ky) of the patch
// is one contiguous run of K*C floats: the run of output (b, oy, ox) for
// kernel row ky starts at column ox*C of input row oy+ky.
func im2col(in []float32, g model.ConvLayer, batch int, col []float32) {
	const k = model.KernelSize
	if g.InC == 1 && k == 5 {
		im2col5(in, g, batch, col)
		return
	}
	run, kk, width := k*g.InC, g.K(), g.InW*g.InC
	for b := 0; b < batch; b++ {
		for oy := 0; oy < g.OutH; oy++ {
			dst := col[(b*g.OutH+oy)*g.OutW*kk:][:g.OutW*kk]
			for ky := 0; ky < k; ky++ {
				src := in[(b*g.InH+oy+ky)*width:][:width]
				for ox := 0; ox < g.OutW; ox++ {
					copy(dst[ox*kk+ky*run:][:run], src[ox*g.InC:])
				}
			}
		}
	}
}

// im2col5 is im2col of a single-channel input under a 5x5 kernel: each
// patch's 25 values moved one by one, a patch at a time, rather than by
// calls to copy of 5 values, which cost 3x more.
func im2col5(in []float32, g model.ConvLayer, batch int, col []float32) {
	const k, kk = 5, 25
	w := g.InW
	for b := 0; b < batch; b++ {
		for oy := 0; oy < g.OutH; oy++ {
			dst := col[(b*g.OutH+oy)*g.OutW*kk:][:g.OutW*kk]
			for ox := 0; ox < g.OutW; ox++ {
				d, at := dst[ox*kk:][:kk:kk], (b*g.InH+oy)*w+ox
				s0, s1, s2, s3, s4 := in[at:][:k:k], in[at+w:][:k:k], in[at+2*w:][:k:k], in[at+3*w:][:k:k], in[at+4*w:][:k:k]
				d[0], d[1], d[2], d[3], d[4] = s0[0], s0[1], s0[2], s0[3], s0[4]
				d[5], d[6], d[7], d[8], d[9] = s1[0], s1[1], s1[2], s1[3], s1[4]
				d[10], d[11], d[12], d[13], d[14] = s2[0], s2[1], s2[2], s2[3], s2[4]
				d[15], d[16], d[17], d[18], d[19] = s3[0], s3[1], s3[2], s3[3], s3[4]
				d[20], d[21], d[22], d[23], d[24] = s4[0], s4[1], s4[2], s4[3], s4[4]
			}
		}
	}
}

// col2im is im2col's adjoint: it sums every patch gradient of col back
// into the input positions it was copied from. dIn is overwritten.
func col2im(col []float32, g model.ConvLayer, batch int, dIn []float32) {
	const k = model.KernelSize
	clear(dIn)
	run, kk, width := k*g.InC, g.K(), g.InW*g.InC
	for b := 0; b < batch; b++ {
		for oy := 0; oy < g.OutH; oy++ {
			src := col[(b*g.OutH+oy)*g.OutW*kk:][:g.OutW*kk]
			for ky := 0; ky < k; ky++ {
				dst := dIn[(b*g.InH+oy+ky)*width:][:width]
				for ox := 0; ox < g.OutW; ox++ {
					vec.Add(dst[ox*g.InC:], src[ox*kk+ky*run:][:run])
				}
			}
		}
	}
}

// maxPool writes ReLU(max + bias) of each 2x2 window of out per channel
// (an odd last row or column is dropped) and records in arg where the
// maximum was. Bias and ReLU commute with the maximum (the bias is the
// same across a channel's window, ReLU is monotone), so they are applied
// to the pooled map only: a quarter of the work of applying them to out.
func maxPool(out, bias []float32, g model.ConvLayer, batch int, pool []float32, arg []int32) {
	c := g.Out
	row, w := g.OutW*c, g.PoolW*c
	dst := 0
	for b := 0; b < batch; b++ {
		for py := 0; py < g.PoolH; py++ {
			base := (b*g.OutH + 2*py) * row
			vec.MaxPoolRow(out[base:base+2*row], bias[:c], pool[dst:dst+w], arg[dst:dst+w], int32(base), int32(c), int32(row))
			dst += w
		}
	}
}

// unpool writes dOut, the gradient of the convolution's output, and adds
// into dBias that of the block's bias: each pooled gradient goes to the
// position its maximum came from if the ReLU after the pool passed it
// (the pooled value is positive), every other position of the window
// gets 0 (vec.UnpoolRow, a row of windows at a time), and the gradients
// passed are added into dBias (their sum is that of dOut's rows).
// Positions in no window (an odd last row or column) are never written:
// they stay 0 from allocation.
func unpool(dPool []float32, arg []int32, pool []float32, g model.ConvLayer, batch int, dOut, dBias []float32) {
	c := g.Out
	row, w := g.OutW*c, g.PoolW*c
	src := 0
	for b := 0; b < batch; b++ {
		for py := 0; py < g.PoolH; py++ {
			base := (b*g.OutH + 2*py) * row
			vec.UnpoolRow(dPool[src:src+w], pool[src:src+w], arg[src:src+w], dOut[base:base+2*row], dBias, int32(base), int32(c), int32(row))
			src += w
		}
	}
}

// addBias adds bias to every row of m (row width len(bias)), then applies
// ReLU if relu is set.
//
// The ReLU and reluMask below select without a branch (package vec:
// AVX2's compare and mask, or Go's conditional move of a bit mask): a
// hidden layer's pre-activations are negative about half the time, at
// random, and a branch on their sign was mispredicted so often that each
// pass over a 128 x 800 layer took ~0.47 ms, together a quarter of the
// MLP's step; masked in Go, 0.07-0.09 ms (BenchmarkElementwise). Every
// value is the same bit for bit (TestBranchFreeReLU: negative values
// become +0, -0 and NaN pass as they did).
func addBias(m, bias []float32, relu bool) {
	w := len(bias)
	for r := 0; r < len(m); r += w {
		row := m[r : r+w : r+w]
		if relu {
			vec.AddReLU(row, bias)
		} else {
			vec.Add(row, bias)
		}
	}
}

// reluMask zeroes the gradient d where the ReLU output act was not
// positive (without a branch: see addBias).
func reluMask(d, act []float32) { vec.MaskNonPositive(d, act) }

// colSum writes the sum of the rows of m (width w) into dst.
func colSum(m []float32, w int, dst []float32) {
	clear(dst)
	for r := 0; r < len(m); r += w {
		vec.Add(dst, m[r:r+w])
	}
}
