package optim

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pstrain/pstrain/ml/vec"
)

func randFloats(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(6)-4)))
	}
	return x
}

func sameFloats(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %v, the separate passes give %v", what, i, got[i], want[i])
		}
	}
}

// Step and StepSum give, for every optimizer, with and without an
// attribution sum and a snapshot to write, what the separate calls give
// (vec.Add into sum, Apply or ApplySum, a copy into out), bit for bit,
// step after step with the rate changing between steps, and leave the
// optimizer in the same state.
func TestStepIsTheSeparatePasses(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 23))
	const n = 1000 + 7 // whole blocks and a tail
	for _, c := range []Config{{Name: "sgd", LR: 0.1}, {Name: "momentum", LR: 0.1, Momentum: 0.9}, {Name: "adam", LR: 0.01}} {
		for _, withSum := range []bool{false, true} {
			for _, withOut := range []bool{false, true} {
				fused, _ := New(c, n)
				ref, _ := New(c, n)
				p, sum := randFloats(r, n), randFloats(r, n)
				wp, wsum := append([]float32(nil), p...), append([]float32(nil), sum...)
				acc := make([]float32, n)
				for step := range 6 {
					lr := 0.01 + 0.1*r.Float64()
					fused.SetLR(lr)
					ref.SetLR(lr)
					g, other := randFloats(r, n), randFloats(r, n)
					scale := float32(1 / float64(1+step%3))
					var s, out []float32
					if withSum {
						s = sum
					}
					if withOut {
						out = make([]float32, n)
					}
					wacc := append([]float32(nil), other...)
					if withSum {
						vec.Add(wsum, g)
					}
					if step%2 == 0 {
						Step(fused, p, g, scale, s, out)
						ref.Apply(wp, append([]float32(nil), g...), scale)
					} else {
						copy(acc, other)
						StepSum(fused, p, acc, g, scale, s, out)
						ref.ApplySum(wp, wacc, append([]float32(nil), g...), scale)
						sameFloats(t, c.Name+" acc", acc, wacc)
					}
					sameFloats(t, c.Name+" params", p, wp)
					sameFloats(t, c.Name+" sum", sum, wsum)
					if withOut {
						sameFloats(t, c.Name+" out", out, wp)
					}
					fs, fsteps := fused.State()
					rs, rsteps := ref.State()
					sameFloats(t, c.Name+" state", fs, rs)
					if fsteps != rsteps {
						t.Fatalf("%s: %d steps, the separate passes %d", c.Name, fsteps, rsteps)
					}
				}
			}
		}
	}
}
