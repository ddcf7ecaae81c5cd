package wire

import "testing"

func BenchmarkPutBF16(b *testing.B) {
	src := make([]float32, 318000)
	for i := range src {
		src[i] = float32(i) * 1e-3
	}
	dst := make([]byte, 2*len(src))
	b.SetBytes(int64(4 * len(src)))
	for b.Loop() {
		PutBF16(dst, src)
	}
}

func BenchmarkDecodeBF16(b *testing.B) {
	src := make([]float32, 318000)
	dst := make([]byte, 2*len(src))
	PutBF16(dst, src)
	b.SetBytes(int64(4 * len(src)))
	for b.Loop() {
		DecodeBF16(src, dst)
	}
}
