package checkpoint

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// hostLittleEndian reports whether the running machine stores integers
// little-endian. It is a pure function of the architecture; the compiler
// folds it to a constant.
func hostLittleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// f32Bytes returns the in-memory bytes of f without copying. On a
// little-endian host these are exactly the safetensors F32 encoding.
func f32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), len(f)*4)
}

// putF32sLE encodes src into dst (len(dst) >= 4*len(src)) as little-endian
// IEEE-754 binary32, element by element. It is the portable path used on
// big-endian hosts.
func putF32sLE(dst []byte, src []float32) {
	_ = dst[:4*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

// getF32sLE decodes little-endian binary32 values from src into dst
// (len(src) >= 4*len(dst)). Portable counterpart of f32Bytes.
func getF32sLE(dst []float32, src []byte) {
	_ = src[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}
