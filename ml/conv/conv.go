// Package conv is the CNN's first convolution block computed directly: a
// 5x5 kernel over a single-channel map, one output row at a time,
// without the im2col patches and the matrix products the other blocks
// use (package nn). Those products are short and wide (25 patch values,
// 16 channels for the default CNN: OpenBLAS ran them at 31-36 GFLOPS)
// and the patches are 25 values an output position (18 times a 28x28
// image); here each output position's channels sum the 25 taps in
// registers.
//
// Row is the forward pass and GradRow the kernel's gradient. On amd64
// with AVX2 and FMA, for channel counts that are multiples of 16, they
// run 16 channels to a pair of instructions; elsewhere, and built with
// -tags purego, in Go. Both fuse each multiply-add (VFMADD231PS; in Go
// math.FMA in float64, rounded to float32), so they agree to float32
// rounding, not bit for bit: the float64 sum can round twice.
package conv

import "math"

// Taps is the kernel's number of values: 5x5.
const Taps = 25

// Row writes one output row of the convolution of a single-channel map
// of width w by the kernel wt, held tap by tap ([Taps, c]: wt[t*c+o] is
// tap t = 5*ky+kx of channel o): for each of the len(out)/c positions x
// and each channel o,
//
//	out[x*c+o] = sum over t of in[(t/5)*w + x + t%5] * wt[t*c+o]
//
// summed in t's order from 0. in starts at the first of the 5 input rows
// under the output row.
func Row(in []float32, w int, wt, out []float32, c int) {
	n := check(in, w, wt, out, c)
	k := 0
	if fast(c) {
		k = n &^ 3
		if k > 0 {
			rowBulk(in, w, wt, out, k, c)
		}
	}
	rowGo(in, w, wt, out, k, n, c)
}

// GradRow adds into dwt ([Taps, c], as Row's wt) the kernel's gradient
// from one output row's: dwt[t*c+o] += sum over x of
// in[(t/5)*w + x + t%5] * dOut[x*c+o], the positions x in order.
func GradRow(in []float32, w int, dOut, dwt []float32, c int) {
	n := check(in, w, dwt, dOut, c)
	if fast(c) && n > 0 {
		gradBulk(in, w, dOut, dwt, n, c)
		return
	}
	gradGo(in, w, dOut, dwt, n, c)
}

// Fast says whether Row and GradRow run c channels on the assembly (on
// amd64 with AVX2 and FMA, c a multiple of 16); else they run Go loops,
// slower than im2col and a matrix product.
func Fast(c int) bool { return fast(c) }

// check checks the lengths Row and GradRow read and write and returns
// the number of positions of the row.
func check(in []float32, w int, wt, out []float32, c int) int {
	if c <= 0 || len(out)%c != 0 || len(wt) < Taps*c {
		panic("conv: a kernel or row of inconsistent lengths")
	}
	n := len(out) / c
	if n > 0 && (w < n+4 || len(in) < 4*w+n+4) {
		panic("conv: an input shorter than the row needs")
	}
	return n
}

func rowGo(in []float32, w int, wt, out []float32, from, n, c int) {
	for x := from; x < n; x++ {
		o := out[x*c : (x+1)*c]
		clear(o)
		for t := range Taps {
			v := in[(t/5)*w+x+t%5]
			for j, k := range wt[t*c : (t+1)*c] {
				o[j] = fma(v, k, o[j])
			}
		}
	}
}

func gradGo(in []float32, w int, dOut, dwt []float32, n, c int) {
	for t := range Taps {
		d, at := dwt[t*c:(t+1)*c], (t/5)*w+t%5
		for x := range n {
			v := in[at+x]
			for j, g := range dOut[x*c : (x+1)*c] {
				d[j] = fma(v, g, d[j])
			}
		}
	}
}

// fma is a*b + c rounded once to float64, then to float32.
func fma(a, b, c float32) float32 {
	return float32(math.FMA(float64(a), float64(b), float64(c)))
}
