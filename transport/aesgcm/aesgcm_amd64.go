//go:build amd64 && !purego

package aesgcm

import "golang.org/x/sys/cpu"

// available is whether this CPU and OS run the assembly: AES-NI for the
// key schedule, BMI2 for the tails' masks, and AVX-512 (F, BW for the
// byte masks, VL) with VAES and VPCLMULQDQ for the bulk. (x/sys/cpu
// reports AVX-512 only where the OS saves the ZMM registers.)
var available = cpu.X86.HasAES && cpu.X86.HasBMI2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW &&
	cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VAES && cpu.X86.HasAVX512VPCLMULQDQ

// expandKey128 writes AES-128's 11 round keys of key into rk.
//
//go:noescape
func expandKey128(rk *[11 * 16]byte, key *[16]byte)

// ghashData hashes data into acc (both in the reversed form of
// ghash.go), zero-padding its last block.
//
//go:noescape
func ghashData(htab *[powers + 4][16]byte, acc *[16]byte, data []byte)

// sealBulk encrypts src into dst (of src's length) in counter mode from
// counter block ctr and hashes the ciphertext into acc.
//
//go:noescape
func sealBulk(rk *[11 * 16]byte, htab *[powers + 4][16]byte, ctr, acc *[16]byte, dst, src []byte)

// openBulk hashes the ciphertext src into acc and decrypts it into dst
// (of src's length, which may be src itself) in counter mode from ctr.
//
//go:noescape
func openBulk(rk *[11 * 16]byte, htab *[powers + 4][16]byte, ctr, acc *[16]byte, dst, src []byte)
