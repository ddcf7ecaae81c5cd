//go:build amd64 && !purego

package vec

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// avx2 is whether this CPU and OS run AVX2 (fixed when the program
// starts).
var avx2 = cpu.X86.HasAVX2

// bulk is how many of n values the assembly takes: whole blocks of
// Lanes, with AVX2.
func bulk(n int) int {
	if !avx2 {
		return 0
	}
	return n &^ (Lanes - 1)
}

// The assembly (vec_amd64.s); each takes a multiple of Lanes values.

//go:noescape
func momentumSumAVX2(p, v, acc, grad *float32, n int, mu, lr, scale float32)

//go:noescape
func momentumAVX2(p, v, grad *float32, n int, mu, lr, scale float32)

//go:noescape
func addAVX2(dst, src *float32, n int)

//go:noescape
func sumSquaresAVX2(x *float32, n int, l *[Lanes]float64)

//go:noescape
func momentumStepAVX2(p, v, grad, sum, out *float32, n int, mu, lr, scale float32, stream int)

//go:noescape
func momentumSumStepAVX2(p, v, acc, grad, sum, out *float32, n int, mu, lr, scale float32, stream int)

//go:noescape
func addBothAVX2(a, b, src *float32, n int)

func momentumStepBulk(p, v, g, sum, out []float32, mu, lr, scale float32) {
	momentumStepAVX2(&p[0], &v[0], &g[0], &sum[0], &out[0], len(g), mu, lr, scale, streamOut(p, out))
}

func momentumSumStepBulk(p, v, acc, g, sum, out []float32, mu, lr, scale float32) {
	momentumSumStepAVX2(&p[0], &v[0], &acc[0], &g[0], &sum[0], &out[0], len(g), mu, lr, scale, streamOut(p, out))
}

// streamOut is 1 when the fused steps store out, a PS's pull snapshot,
// with non-temporal stores: out is not p and is 32-byte aligned (what
// VMOVNTPS needs). Such stores skip reading each line of out into the
// cache before writing it, and leave the caches to p, v and sum, which
// the next step reads again; out is read next by another process (a
// worker's pull). BenchmarkStep's "cold" passes (a PS's step, its
// memory evicted from the caches) measure what that saves.
func streamOut(p, out []float32) int {
	if &out[0] == &p[0] || uintptr(unsafe.Pointer(&out[0]))%32 != 0 {
		return 0
	}
	return 1
}

func addBothBulk(a, b, src []float32) { addBothAVX2(&a[0], &b[0], &src[0], len(src)) }

func momentumSumBulk(p, v, acc, g []float32, mu, lr, scale float32) {
	momentumSumAVX2(&p[0], &v[0], &acc[0], &g[0], len(g), mu, lr, scale)
}

func momentumBulk(p, v, g []float32, mu, lr, scale float32) {
	momentumAVX2(&p[0], &v[0], &g[0], len(g), mu, lr, scale)
}

func addBulk(dst, src []float32) { addAVX2(&dst[0], &src[0], len(src)) }

func sumSquaresBulk(x []float32, l *[Lanes]float64) { sumSquaresAVX2(&x[0], len(x), l) }

func avx2Available() bool { return avx2 }

//go:noescape
func addReLUAVX2(x, bias *float32, n int)

//go:noescape
func maskAVX2(d, act *float32, n int)

//go:noescape
func pixelsAVX2(dst *float32, src *uint8, n int, div float32)

func addReLUBulk(x, bias []float32) { addReLUAVX2(&x[0], &bias[0], len(bias)) }

func maskBulk(d, act []float32) { maskAVX2(&d[0], &act[0], len(act)) }

func pixelsBulk(dst []float32, src []uint8) { pixelsAVX2(&dst[0], &src[0], len(src), 255) }

//go:noescape
func maxPoolRowAVX2(out, bias, pool *float32, arg *int32, w int, base, c, row int32)

//go:noescape
func unpoolRowAVX2(dPool, pool *float32, arg *int32, dOut, dBias *float32, w int, base, c, row int32)

// maxPoolRowBulk and unpoolRowBulk take lengths MaxPoolRow and UnpoolRow
// checked, and c a multiple of 8.
func maxPoolRowBulk(out, bias, pool []float32, arg []int32, w int, base, c, row int32) {
	maxPoolRowAVX2(&out[0], &bias[0], &pool[0], &arg[0], w, base, c, row)
}

func unpoolRowBulk(dPool, pool []float32, arg []int32, dOut, dBias []float32, w int, base, c, row int32) {
	unpoolRowAVX2(&dPool[0], &pool[0], &arg[0], &dOut[0], &dBias[0], w, base, c, row)
}
