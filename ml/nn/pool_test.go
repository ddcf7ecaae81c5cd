package nn

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pstrain/pstrain/ml/model"
)

// maxPoolRef and unpoolRef are the pool's definition, one window and one
// comparison at a time: the first of the window's maxima (top left, top
// right, bottom left, bottom right) wins, a NaN never does; then the
// bias and ReLU. unpool sends each pooled gradient to its maximum's
// position where the pooled value is positive, and 0 to the window's
// other positions, and sums the gradients it sent, window by window,
// into the bias's gradient.
func maxPoolRef(out, bias []float32, g model.ConvLayer, batch int, pool []float32, arg []int32) {
	c := g.Out
	dst := 0
	for b := range batch {
		for py := range g.PoolH {
			for px := range g.PoolW {
				base := ((b*g.OutH+2*py)*g.OutW + 2*px) * c
				for j := range c {
					best, at := out[base+j], base+j
					for _, o := range [...]int{c, g.OutW * c, g.OutW*c + c} {
						if v := out[base+o+j]; v > best {
							best, at = v, base+o+j
						}
					}
					pool[dst+j], arg[dst+j] = max(best+bias[j], 0), int32(at)
				}
				dst += c
			}
		}
	}
}

func unpoolRef(dPool []float32, arg []int32, pool []float32, g model.ConvLayer, batch int, dOut, dBias []float32) {
	c := g.Out
	clear(dBias)
	src := 0
	for b := range batch {
		for py := range g.PoolH {
			for px := range g.PoolW {
				base := ((b*g.OutH+2*py)*g.OutW + 2*px) * c
				for _, o := range [...]int{0, c, g.OutW * c, g.OutW*c + c} {
					for j := range c {
						dOut[base+o+j] = 0
					}
				}
				for j := range c {
					if pool[src+j] > 0 {
						dOut[arg[src+j]] = dPool[src+j]
						dBias[j] += dPool[src+j]
					} else {
						dBias[j] += 0
					}
				}
				src += c
			}
		}
	}
}

// poolCase is a convolution output of g's shape for batch samples: random
// values with many ties (a few levels), signed zeros and, with nan, NaNs.
func poolCase(r *rand.Rand, g model.ConvLayer, batch int, nan bool) (out, bias []float32) {
	out = make([]float32, batch*g.OutH*g.OutW*g.Out)
	for i := range out {
		switch k := r.IntN(12); {
		case k < 2:
			out[i] = float32(math.Copysign(0, -1))
		case k == 2 && nan:
			out[i] = float32(math.NaN())
		case k < 6:
			out[i] = float32(r.IntN(3)) - 1 // ties
		default:
			out[i] = float32(r.NormFloat64())
		}
	}
	bias = make([]float32, g.Out)
	for i := range bias {
		bias[i] = float32(r.NormFloat64() * 0.1)
	}
	bias[0] = float32(math.Copysign(0, -1)) // -0 + -0 is -0: the pool's max must make it +0
	return out, bias
}

// poolShapes are the default CNN's two blocks and odd ones (an odd
// output width leaves a column out of every window; channels not a
// multiple of 8).
func poolShapes() []model.ConvLayer {
	shapes := defaultCNN().ConvLayers()
	return append(shapes,
		model.ConvLayer{OutH: 5, OutW: 5, Out: 3, PoolH: 2, PoolW: 2},
		model.ConvLayer{OutH: 4, OutW: 6, Out: 1, PoolH: 2, PoolW: 3},
		model.ConvLayer{OutH: 7, OutW: 3, Out: 13, PoolH: 3, PoolW: 1})
}

// maxPool and unpool give their definitions' values and positions, bit
// for bit, ties, signed zeros and NaNs included.
func TestPoolIsItsDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for _, g := range poolShapes() {
		for _, nan := range []bool{false, true} {
			const batch = 3
			out, bias := poolCase(r, g, batch, nan)
			n := batch * g.PoolH * g.PoolW * g.Out
			pool, arg := make([]float32, n), make([]int32, n)
			wpool, warg := make([]float32, n), make([]int32, n)
			maxPool(out, bias, g, batch, pool, arg)
			maxPoolRef(out, bias, g, batch, wpool, warg)
			for i := range n {
				if math.Float32bits(pool[i]) != math.Float32bits(wpool[i]) || arg[i] != warg[i] {
					t.Fatalf("%+v nan %t: pooled %d is %v at %d, want %v at %d", g, nan, i, pool[i], arg[i], wpool[i], warg[i])
				}
			}
			dPool := make([]float32, n)
			for i := range dPool {
				dPool[i] = float32(r.NormFloat64())
			}
			dOut, wdOut := make([]float32, len(out)), make([]float32, len(out))
			for i := range dOut { // what a last step left: unpool must overwrite every window's positions
				dOut[i], wdOut[i] = 7, 7
			}
			dBias, wdBias := make([]float32, g.Out), make([]float32, g.Out)
			unpool(dPool, arg, pool, g, batch, dOut, dBias)
			unpoolRef(dPool, warg, wpool, g, batch, wdOut, wdBias)
			for i := range dOut {
				if math.Float32bits(dOut[i]) != math.Float32bits(wdOut[i]) {
					t.Fatalf("%+v nan %t: dOut[%d] = %v, want %v", g, nan, i, dOut[i], wdOut[i])
				}
			}
			fresh, rows := make([]float32, len(out)), make([]float32, g.Out) // the bias's gradient as the sum of dOut's rows
			unpool(dPool, arg, pool, g, batch, fresh, make([]float32, g.Out))
			colSum(fresh, g.Out, rows)
			for j := range dBias {
				if math.Float32bits(dBias[j]) != math.Float32bits(wdBias[j]) {
					t.Fatalf("%+v nan %t: dBias[%d] = %v, want %v", g, nan, j, dBias[j], wdBias[j])
				}
				if d := math.Abs(float64(dBias[j] - rows[j])); d > 1e-5*(1+math.Abs(float64(rows[j]))) {
					t.Fatalf("%+v nan %t: dBias[%d] = %v, the sum of dOut's rows %v", g, nan, j, dBias[j], rows[j])
				}
			}
		}
	}
}

// BenchmarkPool times the default CNN's first block's pool and unpool on
// a batch of 128 random outputs (whose maxima fall anywhere, as a
// trained network's do).
func BenchmarkPool(b *testing.B) {
	g := defaultCNN().ConvLayers()[0]
	const batch = 128
	r := rand.New(rand.NewPCG(7, 9))
	out := make([]float32, batch*g.OutH*g.OutW*g.Out)
	for i := range out {
		out[i] = float32(r.NormFloat64())
	}
	bias := make([]float32, g.Out)
	n := batch * g.PoolH * g.PoolW * g.Out
	pool, arg, dPool, dOut, dBias := make([]float32, n), make([]int32, n), make([]float32, n), make([]float32, len(out)), make([]float32, g.Out)
	b.Run("maxPool", func(b *testing.B) {
		for b.Loop() {
			maxPool(out, bias, g, batch, pool, arg)
		}
	})
	b.Run("unpool", func(b *testing.B) {
		for b.Loop() {
			unpool(dPool, arg, pool, g, batch, dOut, dBias)
		}
	})
}
