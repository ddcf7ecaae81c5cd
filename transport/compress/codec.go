package compress

import (
	"errors"
	"fmt"
)

// ErrMalformed is a payload no encoder of the codec writes: the wrong
// length, an index out of order or range, a scale or value out of
// range, set padding bits.
var ErrMalformed = errors.New("compress: malformed payload")

// Codec encodes an n-value float32 vector into EncodedLen(n) bytes and
// decodes it. Codecs hold no state: one value serves any number of
// vectors and goroutines.
type Codec interface {
	// Kind names the codec.
	Kind() Kind
	// EncodedLen is the length in bytes of an n-value vector's encoding:
	// a function of n alone.
	EncodedLen(n int) int
	// Decode writes the vector src encodes into dst, whose length is the
	// vector's. A payload no encoder writes is refused (ErrMalformed)
	// and dst is then unspecified. A payload may decode to NaN: the
	// encoding of a vector that held NaN or Inf (Feedback.Encode).
	Decode(dst []float32, src []byte) error

	// encode writes acc's encoding into dst (EncodedLen(len(acc))
	// bytes) and leaves in acc what the encoding does not carry: acc
	// minus what Decode will give. acc is finite. scratch holds len(acc)
	// values the codec may use.
	encode(dst []byte, acc, scratch []float32)
	// poison writes an encoding of n values that decodes to NaN.
	poison(dst []byte, n int)
}

// malformed is ErrMalformed with what is wrong.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// checkLen refuses a payload whose length is not c's for n values.
func checkLen(c Codec, n int, src []byte) error {
	if want := c.EncodedLen(n); len(src) != want {
		return malformed("%s: %d bytes for %d values, want %d", c.Kind(), len(src), n, want)
	}
	return nil
}
