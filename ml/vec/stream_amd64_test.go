//go:build amd64 && !purego

package vec

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// The fused steps store out past the caches when out is 32-byte aligned
// and not p, and in the usual way otherwise; both give the Go loops'
// bits, for out at every offset of a float within an aligned block.
func TestFusedStepsStoreOutEitherWay(t *testing.T) {
	if !avx2 {
		t.Skip("no AVX2: the Go loops run")
	}
	r := rand.New(rand.NewPCG(23, 29))
	for _, n := range []int{16, 33, 1000, 4099} {
		buf := make([]float32, n+16)
		base := (32 - int(uintptr(unsafe.Pointer(&buf[0]))%32)) % 32 / 4 // buf[base] is 32-byte aligned
		streamed := 0
		for off := range 8 {
			out := buf[base+off : base+off+n]
			p, v, acc, g, sum := values(r, n), values(r, n), values(r, n), values(r, n), values(r, n)
			mu, lr := float32(0.9), float32(r.Float64())
			streamed += streamOut(p, out)

			wp, wv, wsum, wout := clone(p), clone(v), clone(sum), values(r, n)
			momentumStepGo(wp, wv, g, wsum, wout, mu, lr, 1)
			gp, gv, gsum := clone(p), clone(v), clone(sum)
			MomentumStep(gp, gv, g, gsum, out, mu, lr, 1)
			sameBits(t, "MomentumStep out", out, wout)
			sameBits(t, "MomentumStep p", gp, wp)
			sameBits(t, "MomentumStep v", gv, wv)
			sameBits(t, "MomentumStep sum", gsum, wsum)

			wp, wv, wacc, wsum := clone(p), clone(v), clone(acc), clone(sum)
			momentumSumStepGo(wp, wv, wacc, g, wsum, wout, mu, lr, 0.5)
			gp, gv, gacc, gsum := clone(p), clone(v), clone(acc), clone(sum)
			MomentumSumStep(gp, gv, gacc, g, gsum, out, mu, lr, 0.5)
			sameBits(t, "MomentumSumStep out", out, wout)
			sameBits(t, "MomentumSumStep p", gp, wp)
			sameBits(t, "MomentumSumStep v", gv, wv)
			sameBits(t, "MomentumSumStep acc", gacc, wacc)
			sameBits(t, "MomentumSumStep sum", gsum, wsum)
		}
		if streamed != 1 {
			t.Errorf("n %d: %d of 8 offsets streamed, want 1 (the aligned one)", n, streamed)
		}
		if p := values(r, n); streamOut(p, p) != 0 {
			t.Errorf("n %d: out p streamed", n)
		}
	}
}
