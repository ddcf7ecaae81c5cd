//go:build !amd64 || purego

package aesgcm

// available is false: without the assembly New reports false, and
// nothing below is called.
const available = false

func expandKey128(*[11 * 16]byte, *[16]byte)             { panic("aesgcm: no assembly") }
func ghashData(*[powers + 4][16]byte, *[16]byte, []byte) { panic("aesgcm: no assembly") }
func sealBulk(*[11 * 16]byte, *[powers + 4][16]byte, *[16]byte, *[16]byte, []byte, []byte) {
	panic("aesgcm: no assembly")
}
func openBulk(*[11 * 16]byte, *[powers + 4][16]byte, *[16]byte, *[16]byte, []byte, []byte) {
	panic("aesgcm: no assembly")
}
