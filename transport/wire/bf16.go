package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// bfloat16 is float32's upper half: the same sign and 8-bit exponent
// (so the same range) with 7 mantissa bits instead of 23. pstrain can send
// gradients this way (--wire-dtype bf16) to halve a push's bytes.

// BF16 rounds f to bfloat16, to nearest with ties to even. NaN stays NaN;
// finite values beyond bfloat16's largest round to ±Inf, as IEEE rounding
// does (a PS then refuses the gradient like any other non-finite one).
func BF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it one (rounding could make it Inf)
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// FromBF16 widens a bfloat16 to float32 exactly.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// PutBF16 writes src as little-endian bfloat16 into dst, which must hold
// 2*len(src) bytes.
func PutBF16(dst []byte, src []float32) {
	dst = dst[:2*len(src)]
	if !littleEndian || len(src) == 0 || uintptr(unsafe.Pointer(&dst[0]))%2 != 0 {
		for i, f := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], BF16(f))
		}
		return
	}
	// The same rounding over views of both slices: no per-value bounds
	// checks or byte shuffling (1.6x faster; decoding 4x).
	h := unsafe.Slice((*uint16)(unsafe.Pointer(&dst[0])), len(src))
	for i, b := range unsafe.Slice((*uint32)(unsafe.Pointer(&src[0])), len(src)) {
		if b&0x7fffffff > 0x7f800000 {
			h[i] = uint16(b>>16) | 0x0040
			continue
		}
		h[i] = uint16((b + 0x7fff + (b>>16)&1) >> 16)
	}
}

// DecodeBF16 widens the little-endian bfloat16 values in b into dst,
// which must hold len(b)/2 values.
func DecodeBF16(dst []float32, b []byte) error {
	if len(b)%2 != 0 {
		return fmt.Errorf("wire: %d bytes is not a whole number of bfloat16s", len(b))
	}
	if len(dst) != len(b)/2 {
		return fmt.Errorf("wire: %d bfloat16s for %d values", len(b)/2, len(dst))
	}
	if !littleEndian || len(dst) == 0 || uintptr(unsafe.Pointer(&b[0]))%2 != 0 {
		for i := range dst {
			dst[i] = FromBF16(binary.LittleEndian.Uint16(b[2*i:]))
		}
		return nil
	}
	w := unsafe.Slice((*uint32)(unsafe.Pointer(&dst[0])), len(dst))
	for i, h := range unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(dst)) {
		w[i] = uint32(h) << 16
	}
	return nil
}
