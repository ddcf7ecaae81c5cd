// Package aesgcm is AES-GCM for the data plane's records on CPUs with
// vector AES and carry-less multiplication on 512-bit registers (VAES,
// VPCLMULQDQ and AVX-512; docs/security.md names them). It encrypts and
// authenticates sixteen blocks an iteration, four to a register, where
// crypto/cipher's GCM takes eight blocks of 128-bit registers: AES-128
// messages (the encrypt mode's records), and with AES-256 tags of
// additional data alone (GMAC, the integrity mode's). New reports false
// where the CPU lacks them or for other key sizes; callers then use
// crypto/cipher, whose output this package's matches byte for byte
// (aesgcm_test.go).
//
// The field arithmetic (ghash.go) is GCM's, computed as Intel's
// carry-less multiplication white paper and Go's own amd64 GCM do:
// blocks byte-reversed, H doubled once so that a product needs no
// shift, and each product reduced modulo GCM's polynomial with two
// further carry-less multiplications. The key powers are computed in Go
// (constant time) when the key is set; the bulk is assembly.
package aesgcm

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"unsafe"
)

const (
	nonceSize = 12
	tagSize   = 16
	// powers is how many key powers the bulk multiplies by: one for each
	// block of an iteration.
	powers = 16
)

// errOpen is Open's one error, as crypto/cipher's.
var errOpen = errors.New("cipher: message authentication failed")

// gcm is AES-GCM under one key. Its methods may run concurrently.
type gcm struct {
	block cipher.Block // H and the tag's mask: one block each
	// bulk is crypto/cipher's AES-GCM under an AES-256 key, whose
	// counter mode the assembly does not run: a message with text goes
	// to it, a tag of additional data alone stays here. Nil for AES-128.
	bulk cipher.AEAD
	rk   [11 * 16]byte // AES-128's round keys (zero for AES-256)
	// htab holds the key powers H^16 .. H^1 in the multiplier's form
	// (ghash.go), then four zero entries: a message's last piece of m
	// blocks (m at most 4) reads a register of powers from entry 16-m,
	// H^m .. H^1 and past them lanes that multiply zeros, which the
	// entries keep inside the table.
	htab [powers + 4][16]byte
}

// New is AES-GCM under key with the standard 12-byte nonce and 16-byte
// tag, if this CPU runs the assembly and key is 16 bytes (AES-128) or
// 32 (AES-256, its messages with text sealed by crypto/cipher).
func New(key []byte) (cipher.AEAD, bool) {
	if !available || (len(key) != 16 && len(key) != 32) {
		return nil, false
	}
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, false
	}
	g := &gcm{block: b}
	if len(key) == 16 {
		expandKey128(&g.rk, (*[16]byte)(key))
	} else if g.bulk, err = cipher.NewGCM(b); err != nil {
		return nil, false
	}
	var h [16]byte
	b.Encrypt(h[:], h[:])
	p := keyPowers(h, powers)
	for i := range p {
		p[i].put(&g.htab[powers-1-i])
	}
	clear(p)
	clear(h[:])
	return g, true
}

func (g *gcm) NonceSize() int { return nonceSize }
func (g *gcm) Overhead() int  { return tagSize }

// Seal appends plaintext's encryption and tag to dst, as cipher.AEAD's.
func (g *gcm) Seal(dst, nonce, plaintext, additionalData []byte) []byte {
	if len(nonce) != nonceSize {
		panic("aesgcm: incorrect nonce length given to GCM")
	}
	if g.bulk != nil && len(plaintext) > 0 {
		return g.bulk.Seal(dst, nonce, plaintext, additionalData)
	}
	if uint64(len(plaintext)) > (1<<32-2)*16 {
		panic("aesgcm: message too large for GCM")
	}
	ret, out := sliceForAppend(dst, len(plaintext)+tagSize)
	if inexactOverlap(out, plaintext) || anyOverlap(out, additionalData) {
		panic("aesgcm: invalid buffer overlap")
	}
	j0, ctr, acc := g.begin(nonce, additionalData)
	if len(plaintext) > 0 { // (only AES-128 has text here: see bulk)
		sealBulk(&g.rk, &g.htab, &ctr, &acc, out[:len(plaintext)], plaintext)
	}
	g.tag(out[len(plaintext):], &acc, &j0, len(additionalData), len(plaintext))
	return ret
}

// Open checks ciphertext's tag and appends its plaintext to dst, as
// cipher.AEAD's: on a bad tag it returns errOpen and clears what it
// wrote.
func (g *gcm) Open(dst, nonce, ciphertext, additionalData []byte) ([]byte, error) {
	if len(nonce) != nonceSize {
		panic("aesgcm: incorrect nonce length given to GCM")
	}
	if g.bulk != nil && len(ciphertext) > tagSize {
		return g.bulk.Open(dst, nonce, ciphertext, additionalData)
	}
	if len(ciphertext) < tagSize || uint64(len(ciphertext)) > (1<<32-2)*16+tagSize {
		return nil, errOpen
	}
	n := len(ciphertext) - tagSize
	tag := ciphertext[n:]
	ret, out := sliceForAppend(dst, n)
	if inexactOverlap(out, ciphertext) || anyOverlap(out, additionalData) {
		panic("aesgcm: invalid buffer overlap")
	}
	j0, ctr, acc := g.begin(nonce, additionalData)
	if n > 0 { // (only AES-128 has text here: see bulk)
		openBulk(&g.rk, &g.htab, &ctr, &acc, out, ciphertext[:n])
	}
	var want [tagSize]byte
	g.tag(want[:], &acc, &j0, len(additionalData), n)
	if subtle.ConstantTimeCompare(want[:], tag) != 1 {
		clear(out)
		return nil, errOpen
	}
	return ret, nil
}

// begin is a message's start: its counter block J0 (the nonce, then 1),
// its text's first counter block (then 2), and the hash of its
// additional data.
func (g *gcm) begin(nonce, additionalData []byte) (j0, ctr, acc [16]byte) {
	copy(j0[:], nonce)
	j0[15] = 1
	ctr = j0
	ctr[15] = 2
	ghashData(&g.htab, &acc, additionalData)
	return j0, ctr, acc
}

// tag writes GCM's tag: the lengths block hashed into acc, then acc
// (back in the standard byte order) masked with E(K, J0).
func (g *gcm) tag(out []byte, acc, j0 *[16]byte, aad, text int) {
	var lens [16]byte
	binary.BigEndian.PutUint64(lens[:8], uint64(aad)*8)
	binary.BigEndian.PutUint64(lens[8:], uint64(text)*8)
	ghashData(&g.htab, acc, lens[:])
	var mask [16]byte
	g.block.Encrypt(mask[:], j0[:])
	for i := range mask {
		out[i] = acc[15-i] ^ mask[i]
	}
}

// sliceForAppend extends in by n bytes, reallocating if needed: head is
// the whole slice, tail the n new bytes.
func sliceForAppend(in []byte, n int) (head, tail []byte) {
	if total := len(in) + n; cap(in) >= total {
		head = in[:total]
	} else {
		head = make([]byte, total)
		copy(head, in)
	}
	return head, head[len(in):]
}

// anyOverlap is whether x and y share any memory.
func anyOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 {
		return false
	}
	xs, ys := uintptr(unsafe.Pointer(&x[0])), uintptr(unsafe.Pointer(&y[0]))
	return xs < ys+uintptr(len(y)) && ys < xs+uintptr(len(x))
}

// inexactOverlap is whether x and y share memory other than at the same
// start: a cipher may write x while it reads y only where they are
// apart or the same bytes.
func inexactOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 {
		return false
	}
	xs, ys := uintptr(unsafe.Pointer(&x[0])), uintptr(unsafe.Pointer(&y[0]))
	return xs != ys && anyOverlap(x, y)
}
