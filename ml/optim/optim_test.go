package optim

import (
	"math"
	"testing"
)

// Each optimizer must minimise f(p) = sum (p_i - c_i)^2 from zero.
func TestOptimizersConverge(t *testing.T) {
	target := []float32{1, -2, 0.5, 3}
	for _, c := range []Config{
		{Name: "sgd", LR: 0.1},
		{Name: "momentum", LR: 0.05, Momentum: 0.9},
		{Name: "adam", LR: 0.05},
	} {
		o, err := New(c, len(target))
		if err != nil {
			t.Fatal(err)
		}
		p := make([]float32, len(target))
		g := make([]float32, len(target))
		for it := 0; it < 2000; it++ {
			for i := range p {
				g[i] = 2 * (p[i] - target[i]) * 2 // a sum of two identical grads...
			}
			o.Apply(p, g, 0.5) // ...scaled back to their mean
		}
		for i := range p {
			if math.Abs(float64(p[i]-target[i])) > 1e-3 {
				t.Errorf("%s: p[%d] = %v, want %v", c.Name, i, p[i], target[i])
			}
		}
	}
}

func TestMomentumMatchesHandComputation(t *testing.T) {
	o, _ := New(Config{Name: "momentum", LR: 0.1, Momentum: 0.9}, 1)
	p := []float32{1}
	o.Apply(p, []float32{2}, 1) // v=2, p=1-0.2=0.8
	o.Apply(p, []float32{1}, 1) // v=0.9*2+1=2.8, p=0.8-0.28=0.52
	if math.Abs(float64(p[0])-0.52) > 1e-6 {
		t.Fatalf("p = %v, want 0.52", p[0])
	}
}

func TestStateRoundTrip(t *testing.T) {
	for _, name := range []string{"sgd", "momentum", "adam"} {
		a, _ := New(Config{Name: name, LR: 0.01, Momentum: 0.9}, 3)
		pa := []float32{1, 2, 3}
		a.Apply(pa, []float32{0.1, -0.2, 0.3}, 1)
		st, steps := a.State()
		b, _ := New(Config{Name: name, LR: 0.01, Momentum: 0.9}, 3)
		if err := b.SetState(append([]float32(nil), st...), steps); err != nil {
			t.Fatal(err)
		}
		pb := append([]float32(nil), pa...)
		a.Apply(pa, []float32{0.5, 0.5, 0.5}, 1)
		b.Apply(pb, []float32{0.5, 0.5, 0.5}, 1)
		for i := range pa {
			if pa[i] != pb[i] {
				t.Fatalf("%s: restored optimizer diverged: %v vs %v", name, pa, pb)
			}
		}
	}
	if _, err := New(Config{Name: "rmsprop"}, 1); err == nil {
		t.Fatal("unknown optimizer accepted")
	}
}

func TestApplySumIsAddThenApply(t *testing.T) {
	for _, name := range []string{"sgd", "momentum", "adam"} {
		c := Config{Name: name, LR: 0.05, Momentum: 0.9}
		a, _ := New(c, 64)
		b, _ := New(c, 64)
		pa, pb := make([]float32, 64), make([]float32, 64)
		for step := 0; step < 5; step++ {
			acc, accB := make([]float32, 64), make([]float32, 64)
			g := make([]float32, 64)
			for i := range g {
				acc[i] = float32(i%7)*0.013 - float32(step)*0.01
				accB[i] = acc[i]
				g[i] = float32(i%5)*-0.021 + 0.003
			}
			// The reference: add, apply, clear.
			for i := range accB {
				accB[i] += g[i]
			}
			a.Apply(pa, accB, 0.5)
			b.ApplySum(pb, acc, g, 0.5)
			for i := range pa {
				if pa[i] != pb[i] {
					t.Fatalf("%s step %d: param %d is %v via ApplySum, %v via add+Apply", name, step, i, pb[i], pa[i])
				}
				if acc[i] != 0 {
					t.Fatalf("%s: ApplySum left acc[%d] = %v", name, i, acc[i])
				}
			}
		}
		sa, _ := a.State()
		sb, _ := b.State()
		for i := range sa {
			if sa[i] != sb[i] {
				t.Fatalf("%s: state %d differs", name, i)
			}
		}
	}
}
