package compress

import (
	"math"
)

// int8Codec sends values in chunks of chunkLen: per chunk a signed byte
// e, then one signed byte q per value, which stands for q * 2^e. e is
// the smallest exponent with max|x| <= 127 * 2^e (at least minExp), so
// |x - q*2^e| <= 2^(e-1) <= max|x|/127 per value: about 1% of the
// chunk's largest magnitude. A power-of-two scale makes x - q*2^e exact
// in float32, so what is sent plus the residual is exactly the vector.
type int8Codec struct{}

const (
	chunkLen  = 256
	minExp    = -127 // 127 * 2^-127 is below float32's smallest normal
	maxExp    = 122  // 127 * 2^122 is above float32's largest finite
	poisonExp = -128 // a chunk that decodes to NaN
)

func (int8Codec) Kind() Kind { return Int8 }

func (int8Codec) EncodedLen(n int) int { return n + (n+chunkLen-1)/chunkLen }

func (int8Codec) encode(dst []byte, acc, _ []float32) {
	for off := 0; off < len(acc); off += chunkLen {
		chunk := acc[off:min(off+chunkLen, len(acc))]
		out := dst[off+off/chunkLen:]
		e := chunkExp(chunk)
		out[0] = byte(int8(e))
		inv, scale := math.Ldexp(1, -e), math.Ldexp(1, e)
		for i, v := range chunk {
			q := math.RoundToEven(float64(v) * inv)
			if e == maxExp && math.Abs(q*scale) > math.MaxFloat32 {
				q -= math.Copysign(1, q) // 64 * 2^122 is beyond float32; 63 * 2^122 is not
			}
			out[1+i] = byte(int8(q))
			chunk[i] = v - float32(q*scale)
		}
	}
}

// chunkExp is the smallest exponent e >= minExp with max|x| <= 127*2^e.
func chunkExp(chunk []float32) int {
	var m float32
	for _, v := range chunk {
		m = max(m, abs(v))
	}
	if m == 0 {
		return minExp
	}
	_, e := math.Frexp(float64(m) / 127) // m/127 in [2^(e-1), 2^e)
	for e > minExp && 127*math.Ldexp(1, e-1) >= float64(m) {
		e--
	}
	return max(e, minExp)
}

func (c int8Codec) poison(dst []byte, n int) {
	clear(dst[:c.EncodedLen(n)])
	for off := 0; off < n; off += chunkLen {
		dst[off+off/chunkLen] = 0x80 // poisonExp as an int8
	}
}

func (c int8Codec) Decode(dst []float32, src []byte) error {
	if err := checkLen(c, len(dst), src); err != nil {
		return err
	}
	for off := 0; off < len(dst); off += chunkLen {
		chunk := dst[off:min(off+chunkLen, len(dst))]
		in := src[off+off/chunkLen:]
		e := int(int8(in[0]))
		if e == poisonExp {
			for i := range chunk {
				chunk[i] = float32(math.NaN())
			}
			continue
		}
		if e > maxExp {
			return malformed("int8: chunk at %d has exponent %d, above %d", off, e, maxExp)
		}
		scale := math.Ldexp(1, e)
		for i := range chunk {
			q := int8(in[1+i])
			if q == math.MinInt8 {
				return malformed("int8: value %d is -128, outside [-127, 127]", off+i)
			}
			x := float32(float64(q) * scale)
			if math.IsInf(float64(x), 0) {
				return malformed("int8: value %d, %d * 2^%d, overflows float32", off+i, q, e)
			}
			chunk[i] = x
		}
	}
	return nil
}
