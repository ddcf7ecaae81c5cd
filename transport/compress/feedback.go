package compress

import (
	"fmt"
	"math"
)

// Feedback is a codec with its error-feedback residual for one vector of
// fixed length: each Encode sends the vector plus what earlier encodes
// kept, and keeps what it does not send. Not safe for concurrent use.
//
// Rounding: the codecs split a vector exactly (what is decoded plus what
// is kept is bit for bit the vector encoded) except sign, whose residual
// x - s or x + s rounds when x is much smaller than the scale s. The
// addition of a vector to the residual rounds as any float32 addition
// does. So after N encodes, the sum of the decoded vectors plus the
// residual equals the sum of the vectors exactly when those additions
// are exact (values on a common grid, as in the tests), and otherwise
// to within N float32 roundings of the largest accumulated value per
// coordinate (2N for sign).
type Feedback struct {
	codec    Codec
	residual []float32 // what was not sent yet
	next     []float32 // the residual plus the vector being encoded
	scratch  []float32 // the codec's
}

// NewFeedback is codec with a zero residual for vectors of n values.
func NewFeedback(codec Codec, n int) *Feedback {
	return &Feedback{codec: codec, residual: make([]float32, n), next: make([]float32, n), scratch: make([]float32, n)}
}

// EncodedLen is the length of an encoding.
func (f *Feedback) EncodedLen() int { return f.codec.EncodedLen(len(f.residual)) }

// Residual is what has not been sent yet (the caller must not change
// it; valid until the next Encode or Reset).
func (f *Feedback) Residual() []float32 { return f.residual }

// Reset drops the residual: what it held is never sent.
func (f *Feedback) Reset() { clear(f.residual) }

// Encode encodes the vector made of segs, one after the other, plus the
// residual into dst (reallocated if it holds less than EncodedLen
// bytes), keeps what the encoding does not carry, and returns the
// encoding. A vector holding NaN or Inf, or whose sum with the residual
// overflows, is encoded so that it decodes to NaN (the receiver refuses
// it, as it would the vector itself) and leaves the residual as it was.
func (f *Feedback) Encode(dst []byte, segs [][]float32) ([]byte, error) {
	n := 0
	for _, s := range segs {
		n += len(s)
	}
	if n != len(f.residual) {
		return nil, fmt.Errorf("compress: a vector of %d values for a residual of %d", n, len(f.residual))
	}
	if m := f.EncodedLen(); cap(dst) < m {
		dst = make([]byte, m)
	} else {
		dst = dst[:m]
	}
	if !f.accumulate(segs) {
		f.codec.poison(dst, n)
		return dst, nil
	}
	f.residual, f.next = f.next, f.residual
	f.codec.encode(dst, f.residual, f.scratch)
	return dst, nil
}

// accumulate sets next to the residual plus the segments and reports
// whether every sum is finite.
func (f *Feedback) accumulate(segs [][]float32) bool {
	off := 0
	var inf float32 // 0 while every sum is finite; NaN after a NaN or an Inf
	for _, s := range segs {
		r, out := f.residual[off:off+len(s)], f.next[off:off+len(s)]
		for i, v := range s {
			x := r[i] + v
			out[i] = x
			inf += x * 0
		}
		off += len(s)
	}
	return !math.IsNaN(float64(inf))
}
