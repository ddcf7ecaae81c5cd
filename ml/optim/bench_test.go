package optim

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkApplySum times a sync step's fused update of one default
// shard (318,400 parameters) with each optimizer.
func BenchmarkApplySum(b *testing.B) {
	const n = 318400
	r := rand.New(rand.NewPCG(1, 2))
	p, acc, g := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range p {
		p[i], g[i] = float32(r.NormFloat64()), float32(r.NormFloat64()*0.01)
	}
	for _, name := range []string{"sgd", "momentum", "adam"} {
		o, err := New(Config{Name: name, LR: 0.1, Momentum: 0.9}, n)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				o.ApplySum(p, acc, g, 0.5)
			}
		})
	}
}
