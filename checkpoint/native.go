package checkpoint

import (
	"encoding/binary"
	"io"
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

// u64Bytes returns the in-memory bytes of u without copying (the
// safetensors U64 encoding on a little-endian host).
func u64Bytes(u []uint64) []byte {
	if len(u) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(u))), len(u)*8)
}

// writeU64s writes u as little-endian uint64s: its memory on a native
// host, through a buffer of chunkSize bytes otherwise.
func writeU64s(w io.Writer, u []uint64, native bool) (int64, error) {
	if native {
		n, err := w.Write(u64Bytes(u))
		return int64(n), err
	}
	buf := make([]byte, chunkSize)
	written := int64(0)
	for len(u) > 0 {
		k := min(len(u), chunkSize/8)
		for i, v := range u[:k] {
			binary.LittleEndian.PutUint64(buf[8*i:], v)
		}
		n, err := w.Write(buf[:8*k])
		written += int64(n)
		if err != nil {
			return written, err
		}
		u = u[k:]
	}
	return written, nil
}

// readU64s fills u from the little-endian uint64s at off.
func readU64s(r io.ReaderAt, u []uint64, off int64, native bool) error {
	if native {
		return readFullAt(r, u64Bytes(u), off)
	}
	buf := make([]byte, chunkSize)
	for len(u) > 0 {
		k := min(len(u), chunkSize/8)
		if err := readFullAt(r, buf[:8*k], off); err != nil {
			return err
		}
		for i := range u[:k] {
			u[i] = binary.LittleEndian.Uint64(buf[8*i:])
		}
		off += int64(8 * k)
		u = u[k:]
	}
	return nil
}
