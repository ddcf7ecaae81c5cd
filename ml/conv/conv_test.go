package conv

import (
	"math"
	"math/rand/v2"
	"testing"
)

// cases are channel counts the assembly takes (multiples of 16) and
// others, and rows of every length around its blocks of 4 positions.
var (
	channels  = []int{16, 32, 8, 3}
	positions = []int{0, 1, 3, 4, 5, 8, 24, 27}
)

func randoms(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// near says whether got is within float32 rounding of want, a sum of
// terms whose magnitudes add up to scale.
func near(got float32, want, scale float64) bool {
	return math.Abs(float64(got)-want) <= 1e-6*(scale+1)
}

// Row is its definition, summed in float64, for every channel count and
// row length, and writes nothing past its row.
func TestRowIsItsDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range channels {
		for _, n := range positions {
			w := n + 4 + r.IntN(3)
			in, wt := randoms(r, 4*w+n+4+r.IntN(3)), randoms(r, Taps*c)
			out := randoms(r, n*c+7) // what a last step left, and a tail
			tail := append([]float32(nil), out[n*c:]...)
			Row(in, w, wt, out[:n*c], c)
			for x := range n {
				for o := range c {
					var want, scale float64
					for tap := range Taps {
						p := float64(in[(tap/5)*w+x+tap%5]) * float64(wt[tap*c+o])
						want += p
						scale += math.Abs(p)
					}
					if got := out[x*c+o]; !near(got, want, scale) {
						t.Fatalf("c %d n %d: out[%d][%d] = %v, want %v", c, n, x, o, got, want)
					}
				}
			}
			for i, v := range out[n*c:] {
				if v != tail[i] {
					t.Fatalf("c %d n %d: wrote past the row at %d", c, n, i)
				}
			}
		}
	}
}

// GradRow adds its definition, summed in float64, into what dwt holds.
func TestGradRowIsItsDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range channels {
		for _, n := range positions {
			w := n + 4 + r.IntN(3)
			in, dOut := randoms(r, 4*w+n+4), randoms(r, n*c)
			dwt := randoms(r, Taps*c+5)
			before := append([]float32(nil), dwt...)
			GradRow(in, w, dOut, dwt[:Taps*c], c)
			for tap := range Taps {
				for o := range c {
					want, scale := float64(before[tap*c+o]), math.Abs(float64(before[tap*c+o]))
					for x := range n {
						p := float64(in[(tap/5)*w+x+tap%5]) * float64(dOut[x*c+o])
						want += p
						scale += math.Abs(p)
					}
					if got := dwt[tap*c+o]; !near(got, want, scale) {
						t.Fatalf("c %d n %d: dwt[%d][%d] = %v, want %v", c, n, tap, o, got, want)
					}
				}
			}
			for i := Taps * c; i < len(dwt); i++ {
				if dwt[i] != before[i] {
					t.Fatalf("c %d n %d: wrote past the kernel at %d", c, n, i)
				}
			}
		}
	}
}

// The assembly and the Go loops agree to float32 rounding where the
// assembly runs (and are the same code where it does not).
func TestAssemblyIsTheGoLoops(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const c, n, w = 32, 24, 28
	in, wt, dOut := randoms(r, 4*w+n+4), randoms(r, Taps*c), randoms(r, n*c)
	out, goOut := make([]float32, n*c), make([]float32, n*c)
	Row(in, w, wt, out, c)
	rowGo(in, w, wt, goOut, 0, n, c)
	dwt, goDwt := randoms(r, Taps*c), make([]float32, Taps*c)
	copy(goDwt, dwt)
	GradRow(in, w, dOut, dwt, c)
	gradGo(in, w, dOut, goDwt, n, c)
	for i := range out {
		if math.Abs(float64(out[i]-goOut[i])) > 1e-5*(1+math.Abs(float64(goOut[i]))) {
			t.Fatalf("out[%d]: %v, the Go loop %v", i, out[i], goOut[i])
		}
	}
	for i := range dwt {
		if math.Abs(float64(dwt[i]-goDwt[i])) > 1e-5*(1+math.Abs(float64(goDwt[i]))) {
			t.Fatalf("dwt[%d]: %v, the Go loop %v", i, dwt[i], goDwt[i])
		}
	}
}

func TestShortInputPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a row past the input did not panic")
		}
	}()
	Row(make([]float32, 4*10+6+3), 10, make([]float32, Taps*16), make([]float32, 6*16), 16)
}

func BenchmarkRow(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	const c, n, w = 16, 24, 28
	in, wt, dOut := randoms(r, 4*w+n+4), randoms(r, Taps*c), randoms(r, n*c)
	out, dwt := make([]float32, n*c), make([]float32, Taps*c)
	b.Run("Row", func(b *testing.B) {
		for b.Loop() {
			Row(in, w, wt, out, c)
		}
	})
	b.Run("GradRow", func(b *testing.B) {
		for b.Loop() {
			GradRow(in, w, dOut, dwt, c)
		}
	})
}
