//go:build !amd64 || purego

package vec

// bulk is 0: without the assembly, the Go loops take every value.
func bulk(int) int { return 0 }

func momentumSumBulk(p, v, acc, g []float32, mu, lr, scale float32) {
	momentumSumGo(p, v, acc, g, mu, lr, scale)
}

func momentumBulk(p, v, g []float32, mu, lr, scale float32) { momentumGo(p, v, g, mu, lr, scale) }

func momentumStepBulk(p, v, g, sum, out []float32, mu, lr, scale float32) {
	momentumStepGo(p, v, g, sum, out, mu, lr, scale)
}

func momentumSumStepBulk(p, v, acc, g, sum, out []float32, mu, lr, scale float32) {
	momentumSumStepGo(p, v, acc, g, sum, out, mu, lr, scale)
}

func addBothBulk(a, b, src []float32) { addBothGo(a, b, src) }

func addBulk(dst, src []float32) { addGo(dst, src) }

func sumSquaresBulk(x []float32, l *[Lanes]float64) { sumSquaresGo(x, 0, l) }

func avx2Available() bool { return false }

func addReLUBulk(x, bias []float32) { addReLUGo(x, bias) }

func maskBulk(d, act []float32) { maskGo(d, act) }

func pixelsBulk(dst []float32, src []uint8) { pixelsGo(dst, src) }

func maxPoolRowBulk(out, bias, pool []float32, arg []int32, w int, base, c, row int32) {
	panic("vec: no assembly")
}

func unpoolRowBulk(dPool, pool []float32, arg []int32, dOut, dBias []float32, w int, base, c, row int32) {
	panic("vec: no assembly")
}
