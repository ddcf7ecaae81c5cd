package compress

import (
	"encoding/binary"
	"math"
)

// noneCodec is float32 as it is, little-endian: everything is sent,
// nothing is kept.
type noneCodec struct{}

func (noneCodec) Kind() Kind           { return None }
func (noneCodec) EncodedLen(n int) int { return 4 * n }

func (noneCodec) encode(dst []byte, acc, _ []float32) {
	for i, v := range acc {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		acc[i] = 0
	}
}

func (noneCodec) poison(dst []byte, n int) {
	for i := range n {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(float32(math.NaN())))
	}
}

func (c noneCodec) Decode(dst []float32, src []byte) error {
	if err := checkLen(c, len(dst), src); err != nil {
		return err
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return nil
}
