package compress

import (
	"math"
)

// signCodec sends values in chunks of chunkLen: per chunk a signed byte
// e, then one bit per value (bit i%8 of the chunk's byte i/8, set for a
// negative value): a value decodes as -2^e or +2^e. 2^e is the chunk's
// mean magnitude rounded to the nearest power of two (in log scale,
// within a factor of sqrt 2), a scaled sign as in EF-SignSGD, per chunk
// so that a run of zeros (the weights of an image's empty border) is
// sent as zeros: e = signZero stands for a scale of 0 (a chunk of
// zeros, or one whose mean is below 2^minExp), e = signPoison for NaN.
// The error of a single step is large (a value of 0 in a chunk that is
// not all zeros decodes as +2^e); the residual carries it into the next
// steps.
type signCodec struct{}

const (
	signZero   = -128
	signPoison = 127
	signMaxExp = 126
)

func (signCodec) Kind() Kind { return Sign }

func (signCodec) EncodedLen(n int) int {
	full, rest := n/chunkLen, n%chunkLen
	size := full * (1 + chunkLen/8)
	if rest > 0 {
		size += 1 + (rest+7)/8
	}
	return size
}

// signChunk is where chunk i of an encoding starts.
func signChunk(i int) int { return i * (1 + chunkLen/8) }

func (signCodec) encode(dst []byte, acc, _ []float32) {
	for off := 0; off < len(acc); off += chunkLen {
		chunk := acc[off:min(off+chunkLen, len(acc))]
		out := dst[signChunk(off/chunkLen):]
		e, s := signScale(chunk)
		out[0] = byte(int8(e))
		bitsOut := out[1 : 1+(len(chunk)+7)/8]
		clear(bitsOut)
		for i, v := range chunk {
			if math.Signbit(float64(v)) {
				bitsOut[i/8] |= 1 << (i % 8)
				chunk[i] = v + s
			} else {
				chunk[i] = v - s
			}
		}
	}
}

// signScale is the exponent byte and the scale of a chunk: its mean
// magnitude rounded to a power of two, or signZero and 0.
func signScale(chunk []float32) (int, float32) {
	var sum float64
	for _, v := range chunk {
		sum += float64(abs(v))
	}
	if sum == 0 {
		return signZero, 0
	}
	e := int(math.Round(math.Log2(sum / float64(len(chunk)))))
	if e < minExp {
		return signZero, 0
	}
	e = min(e, signMaxExp)
	return e, float32(math.Ldexp(1, e))
}

func (c signCodec) poison(dst []byte, n int) {
	clear(dst[:c.EncodedLen(n)])
	for off := 0; off < n; off += chunkLen {
		dst[signChunk(off/chunkLen)] = signPoison
	}
}

func (c signCodec) Decode(dst []float32, src []byte) error {
	n := len(dst)
	if err := checkLen(c, n, src); err != nil {
		return err
	}
	for off := 0; off < n; off += chunkLen {
		chunk := dst[off:min(off+chunkLen, n)]
		in := src[signChunk(off/chunkLen):]
		var s float32
		switch e := int(int8(in[0])); e {
		case signZero:
		case signPoison:
			s = float32(math.NaN())
		default:
			s = float32(math.Ldexp(1, e))
		}
		bitsIn := in[1 : 1+(len(chunk)+7)/8]
		if r := len(chunk) % 8; r != 0 && bitsIn[len(bitsIn)-1]>>r != 0 {
			return malformed("sign: padding bits set after value %d", off+len(chunk))
		}
		for i := range chunk {
			if bitsIn[i/8]&(1<<(i%8)) != 0 {
				chunk[i] = -s
			} else {
				chunk[i] = s
			}
		}
	}
	return nil
}
