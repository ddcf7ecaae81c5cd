// Package wire converts between float32 slices and the raw little-endian
// bytes that travel in pstrain's messages and files. On little-endian
// machines (every platform pstrain targets) the conversion is a zero-cost
// view of the same memory; elsewhere it copies with encoding/binary.
package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// littleEndian is true when the host stores float32 little-endian.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// SharesMemory reports whether Bytes and Floats return views of their
// argument's memory (little-endian hosts) rather than copies.
func SharesMemory() bool { return littleEndian }

// Bytes returns x as little-endian bytes. On little-endian hosts it shares
// x's memory: do not modify x while the bytes are in use.
func Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), 4*len(x))
	}
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// Floats returns b as float32s. It shares b's memory when the host is
// little-endian and b is 4-byte aligned, and copies otherwise.
func Floats(b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("wire: %d bytes is not a whole number of float32s", len(b))
	}
	if len(b) == 0 {
		return nil, nil
	}
	if littleEndian && uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), nil
	}
	x := make([]float32, len(b)/4)
	Decode(x, b)
	return x, nil
}

// View returns b as float32s sharing b's memory, so that writing them
// writes b's little-endian bytes; false when it cannot (a big-endian
// host, a length that is not a whole number of float32s, or b not
// 4-byte aligned).
func View(b []byte) ([]float32, bool) {
	if !littleEndian || len(b)%4 != 0 || len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil, false
	}
	x, err := Floats(b)
	return x, err == nil
}

// Decode copies little-endian bytes b into dst (len(b) must be 4*len(dst)).
func Decode(dst []float32, b []byte) {
	if littleEndian && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), b)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}
