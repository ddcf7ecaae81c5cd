package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The branch-free ReLU and its gradient mask against the plain
// definitions, bit for bit, over random values and the edge cases: -0,
// +0, NaN of either sign, infinities.
func TestBranchFreeReLU(t *testing.T) {
	negNaN := math.Float32frombits(0xffc00000)
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.NaN()), negNaN,
		float32(math.Inf(1)), float32(math.Inf(-1)), -1e-30, 1e-30, -3, 3}
	r := rand.New(rand.NewPCG(8, 9))
	const w = 23 // a block of 16 for the AVX2 kernels (package vec) and a tail of 7 for Go
	m := make([]float32, 0, 20*w)
	m = append(m, special...)
	for len(m) < cap(m) {
		m = append(m, float32(r.NormFloat64()))
	}
	bias := make([]float32, w)
	for j := range bias {
		bias[j] = float32(r.NormFloat64() * 0.1)
	}
	bias[0], bias[1], bias[2] = 0, 0, 0 // the specials of the first row pass unchanged

	for _, relu := range []bool{false, true} {
		got := append([]float32(nil), m...)
		addBias(got, bias, relu)
		for i, v := range m {
			want := v + bias[i%w]
			if relu && want < 0 {
				want = 0
			}
			if math.Float32bits(got[i]) != math.Float32bits(want) {
				t.Errorf("addBias(relu=%v) of %v + %v = %v (bits %#x), want %v (bits %#x)", relu, v, bias[i%w], got[i], math.Float32bits(got[i]), want, math.Float32bits(want))
			}
		}
	}

	d := make([]float32, len(m))
	for i := range d {
		d[i] = float32(r.NormFloat64())
	}
	got := append([]float32(nil), d...)
	reluMask(got, m)
	for i, a := range m {
		want := d[i]
		if a <= 0 {
			want = 0
		}
		if math.Float32bits(got[i]) != math.Float32bits(want) {
			t.Errorf("reluMask at act %v: %v, want %v", a, got[i], want)
		}
	}
}

// BenchmarkElementwise times the MLP's element-wise passes on a
// 128 x 800 hidden layer with signs at random (as a net's are).
func BenchmarkElementwise(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const rows, cols = 128, 800
	m := make([]float32, rows*cols)
	for i := range m {
		m[i] = float32(r.NormFloat64())
	}
	bias := make([]float32, cols)
	act := append([]float32(nil), m...)
	addBias(act, bias, true)
	work := make([]float32, len(m))
	b.Run("addBias+relu", func(b *testing.B) {
		for b.Loop() {
			copy(work, m)
			addBias(work, bias, true)
		}
	})
	b.Run("reluMask", func(b *testing.B) {
		for b.Loop() {
			copy(work, m)
			reluMask(work, act)
		}
	})
	b.Run("colSum", func(b *testing.B) {
		for b.Loop() {
			colSum(m, cols, bias)
		}
	})
}
