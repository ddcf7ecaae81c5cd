package compress

import (
	"errors"
	"testing"
)

// FuzzDecode decodes arbitrary bytes as a vector of n values with every
// codec: never a panic, and every refusal is ErrMalformed.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{}, uint16(0))
	f.Add([]byte{0x80, 1, 2, 3}, uint16(3))
	for _, sp := range specs {
		fb := NewFeedback(sp.Codec(), 11)
		buf, _ := fb.Encode(nil, [][]float32{{1, -2, 3, 0, 5, -6, 7, 8, 9, 0.5, -0.25}})
		f.Add(buf, uint16(11))
	}
	f.Fuzz(func(t *testing.T, src []byte, n uint16) {
		dst := make([]float32, n%4096)
		for _, sp := range specs {
			if err := sp.Codec().Decode(dst, src); err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("%s: %v is not ErrMalformed", sp, err)
			}
		}
	})
}

// FuzzEncode encodes arbitrary values (NaN, Inf and subnormals included)
// over a few steps and checks that every encoding decodes.
func FuzzEncode(f *testing.F) {
	f.Add([]byte{0, 0, 0x80, 0x7f, 1, 0, 0, 0}, uint8(1))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0x7f, 0x7f, 0, 0, 0, 0x80}, uint8(2))
	f.Fuzz(func(t *testing.T, raw []byte, steps uint8) {
		v := make([]float32, len(raw)/4)
		noneCodec{}.Decode(v, raw[:4*len(v)])
		for _, sp := range specs {
			c := sp.Codec()
			fb := NewFeedback(c, len(v))
			dec := make([]float32, len(v))
			for range 1 + steps%4 {
				buf, err := fb.Encode(nil, [][]float32{v})
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Decode(dec, buf); err != nil {
					t.Fatalf("%s: decoding its own encoding: %v", sp, err)
				}
			}
		}
	})
}
