package compress

import (
	"math/rand/v2"
	"testing"
)

// shardLen is one shard's values in the default model (784-800-10 over
// two shards).
const shardLen = 318010

// BenchmarkEncode is one push's encoding of a shard's gradient: the
// residual added, the codec's pass, the residual kept.
func BenchmarkEncode(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	g := make([]float32, shardLen)
	for i := range g {
		g[i] = float32(rng.NormFloat64()) * 1e-3
	}
	for _, sp := range specs {
		b.Run(sp.String(), func(b *testing.B) {
			fb := NewFeedback(sp.Codec(), shardLen)
			buf := make([]byte, fb.EncodedLen())
			b.SetBytes(4 * shardLen)
			for b.Loop() {
				buf, _ = fb.Encode(buf, [][]float32{g})
			}
		})
	}
}

// BenchmarkDecode is a PS's decoding of one push.
func BenchmarkDecode(b *testing.B) {
	rng := rand.New(rand.NewPCG(2, 2))
	g := make([]float32, shardLen)
	for i := range g {
		g[i] = float32(rng.NormFloat64()) * 1e-3
	}
	dst := make([]float32, shardLen)
	for _, sp := range specs {
		b.Run(sp.String(), func(b *testing.B) {
			c := sp.Codec()
			buf, _ := NewFeedback(c, shardLen).Encode(nil, [][]float32{g})
			b.SetBytes(4 * shardLen)
			for b.Loop() {
				if err := c.Decode(dst, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
