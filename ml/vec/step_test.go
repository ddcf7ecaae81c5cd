package vec

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The fused kernels give what their separate passes give, bit for bit,
// whatever the length, through the assembly and the Go loops alike:
// MomentumStep is Momentum, Add into sum and a copy of p; MomentumSumStep
// is MomentumSum, Add of g alone into sum and a copy; AddBoth is two Adds.
// out may be p.
func TestFusedKernelsAreTheSeparatePasses(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	for _, n := range lengths {
		for _, scale := range []float32{1, 0.5, 1.0 / 3} {
			mu, lr := float32(r.Float64()), float32(r.Float64())
			p, v, acc, g, sum := values(r, n), values(r, n), values(r, n), values(r, n), values(r, n)

			// The separate passes.
			wp, wv, wsum := clone(p), clone(v), clone(sum)
			Momentum(wp, wv, g, mu, lr, scale)
			Add(wsum, g)
			for _, step := range []func(p, v, g, sum, out []float32){
				func(p, v, g, sum, out []float32) { MomentumStep(p, v, g, sum, out, mu, lr, scale) },
				func(p, v, g, sum, out []float32) { momentumStepGo(p, v, g, sum, out, mu, lr, scale) },
			} {
				gp, gv, gsum, out := clone(p), clone(v), clone(sum), values(r, n)
				step(gp, gv, g, gsum, out)
				sameBits(t, "MomentumStep p", gp, wp)
				sameBits(t, "MomentumStep v", gv, wv)
				sameBits(t, "MomentumStep sum", gsum, wsum)
				sameBits(t, "MomentumStep out", out, wp)
				gp, gv, gsum = clone(p), clone(v), clone(sum)
				step(gp, gv, g, gsum, gp) // out is p
				sameBits(t, "MomentumStep p (out p)", gp, wp)
			}

			wp, wv, wacc, wsum := clone(p), clone(v), clone(acc), clone(sum)
			MomentumSum(wp, wv, wacc, g, mu, lr, scale)
			Add(wsum, g)
			for _, step := range []func(p, v, acc, g, sum, out []float32){
				func(p, v, acc, g, sum, out []float32) { MomentumSumStep(p, v, acc, g, sum, out, mu, lr, scale) },
				func(p, v, acc, g, sum, out []float32) { momentumSumStepGo(p, v, acc, g, sum, out, mu, lr, scale) },
			} {
				gp, gv, gacc, gsum, out := clone(p), clone(v), clone(acc), clone(sum), values(r, n)
				step(gp, gv, gacc, g, gsum, out)
				sameBits(t, "MomentumSumStep p", gp, wp)
				sameBits(t, "MomentumSumStep v", gv, wv)
				sameBits(t, "MomentumSumStep acc", gacc, wacc)
				sameBits(t, "MomentumSumStep sum", gsum, wsum)
				sameBits(t, "MomentumSumStep out", out, wp)
			}

			wa, wb := clone(acc), clone(sum)
			Add(wa, g)
			Add(wb, g)
			ga, gb := clone(acc), clone(sum)
			AddBoth(ga, gb, g)
			sameBits(t, "AddBoth a", ga, wa)
			sameBits(t, "AddBoth b", gb, wb)
			ga, gb = clone(acc), clone(sum)
			addBothGo(ga, gb, g)
			sameBits(t, "addBothGo a", ga, wa)
			sameBits(t, "addBothGo b", gb, wb)
		}
	}
}

// The fused kernels leave the values past the slices they are given
// alone.
func TestFusedKernelsStayInBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 19))
	for _, n := range lengths {
		const pad = 32
		p, v, acc, sum, out := values(r, n+pad), values(r, n+pad), values(r, n+pad), values(r, n+pad), values(r, n+pad)
		g := values(r, n)
		p0, v0, acc0, sum0, out0 := clone(p), clone(v), clone(acc), clone(sum), clone(out)
		MomentumStep(p[:n], v[:n], g, sum[:n], out[:n], 0.9, 0.1, 1)
		MomentumSumStep(p[:n], v[:n], acc[:n], g, sum[:n], out[:n], 0.9, 0.1, 0.5)
		AddBoth(acc[:n], sum[:n], g)
		for _, c := range []struct {
			what      string
			got, want []float32
		}{{"p", p, p0}, {"v", v, v0}, {"acc", acc, acc0}, {"sum", sum, sum0}, {"out", out, out0}} {
			sameBits(t, c.what+" past the end", c.got[n:], c.want[n:])
		}
	}
}

// BenchmarkStep times a one-worker PS step's passes over the whole MLP
// (636,010 values), fused against the separate passes they replace:
// MomentumStep against Momentum, Add into the attribution sum and a copy
// into the snapshot (one of three, as a PS rotates them); CopySumSquares
// against a copy and SumSquares. "cold": each pass starts with its
// memory evicted from the caches (64 MiB written between passes, not
// timed), as between a PS's steps while its workers compute.
func BenchmarkStep(b *testing.B) {
	const n = 636010
	r := rand.New(rand.NewPCG(1, 2))
	normals := func() []float32 { // (no denormals: a gradient's values)
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 1e-3)
		}
		return x
	}
	p, v, g, sum := normals(), normals(), normals(), normals()
	outs := [][]float32{normals(), normals(), normals()}
	var sink float64
	passes := []struct {
		name string
		f    func(out []float32)
	}{
		{"update/fused", func(out []float32) { MomentumStep(p, v, g, sum, out, 0.9, 1e-9, 1) }},
		{"update/separate", func(out []float32) {
			Momentum(p, v, g, 0.9, 1e-9, 1)
			Add(sum, g)
			copy(out, p)
		}},
		{"copy/fused", func(out []float32) { sink += CopySumSquares(out, g) }},
		{"copy/separate", func(out []float32) { copy(out, g); sink += SumSquares(out) }},
	}
	var junk []byte
	for _, cold := range []bool{false, true} {
		if cold {
			junk = make([]byte, 64<<20)
		}
		for _, k := range passes {
			b.Run(map[bool]string{false: "warm/", true: "cold/"}[cold]+k.name, func(b *testing.B) {
				b.SetBytes(4 * n)
				for i := range b.N {
					if cold {
						b.StopTimer()
						for j := 0; j < len(junk); j += 64 {
							junk[j]++
						}
						b.StartTimer()
					}
					k.f(outs[i%len(outs)])
				}
			})
		}
	}
}

// CopySumSquares copies and gives SumSquares bit for bit, across chunks
// and tails, and flags a NaN or an Inf as SumSquares does.
func TestCopySumSquaresIsCopyThenSumSquares(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 29))
	for _, n := range append(lengths, copyChunk, copyChunk+16, 3*copyChunk+17, 10007) {
		src := values(r, n)
		if n > 3 {
			src[n/3] = float32(math.Inf(1 - 2*(n%2)))
		}
		for _, x := range [][]float32{values(r, n), src} {
			dst := make([]float32, n)
			got, want := CopySumSquares(dst, x), SumSquares(x)
			if math.Float64bits(got) != math.Float64bits(want) {
				t.Fatalf("%d values: CopySumSquares = %v, SumSquares %v", n, got, want)
			}
			sameBits(t, "the copy", dst, x)
		}
	}
}
