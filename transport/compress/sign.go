package compress

import (
	"encoding/binary"
	"math"
)

// signCodec sends a float32 scale s, then one bit per value (bit i%8 of
// byte i/8, set for a negative value): a value decodes as -s or +s. s is
// the vector's mean magnitude rounded to the nearest power of two (in
// log scale, within a factor of sqrt 2), a scaled sign as in EF-SignSGD:
// the error of a single step is large (a value of 0 decodes as +s), and
// the residual carries it into the next steps.
type signCodec struct{}

func (signCodec) Kind() Kind { return Sign }

func (signCodec) EncodedLen(n int) int { return 4 + (n+7)/8 }

func (signCodec) encode(dst []byte, acc, _ []float32) {
	s := signScale(acc)
	binary.LittleEndian.PutUint32(dst, math.Float32bits(s))
	bitsOut := dst[4 : 4+(len(acc)+7)/8]
	clear(bitsOut)
	for i, v := range acc {
		if math.Signbit(float64(v)) {
			bitsOut[i/8] |= 1 << (i % 8)
			acc[i] = v + s
		} else {
			acc[i] = v - s
		}
	}
}

// signScale is the mean of acc's magnitudes rounded to a power of two
// (0 for a vector of zeros), within float32's range.
func signScale(acc []float32) float32 {
	var sum float64
	for _, v := range acc {
		sum += float64(abs(v))
	}
	if sum == 0 {
		return 0
	}
	e := math.Round(math.Log2(sum / float64(len(acc))))
	return float32(math.Ldexp(1, int(max(-149, min(e, 127)))))
}

func (c signCodec) poison(dst []byte, n int) {
	clear(dst[:c.EncodedLen(n)])
	binary.LittleEndian.PutUint32(dst, math.Float32bits(float32(math.NaN())))
}

func (c signCodec) Decode(dst []float32, src []byte) error {
	n := len(dst)
	if err := checkLen(c, n, src); err != nil {
		return err
	}
	s := math.Float32frombits(binary.LittleEndian.Uint32(src))
	if frac, _ := math.Frexp(float64(s)); !math.IsNaN(float64(s)) && s != 0 && (frac != 0.5 || math.IsInf(float64(s), 0)) {
		return malformed("sign: scale %v is not a finite power of two >= 0", s)
	}
	bitsIn := src[4:]
	if n%8 != 0 && bitsIn[n/8]>>(n%8) != 0 {
		return malformed("sign: padding bits set after value %d", n)
	}
	for i := range dst {
		if bitsIn[i/8]&(1<<(i%8)) != 0 {
			dst[i] = -s
		} else {
			dst[i] = s
		}
	}
	return nil
}
