package aesgcm

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// stdGCM is crypto/cipher's AES-GCM under key: the reference.
func stdGCM(t testing.TB, key []byte) cipher.AEAD {
	b, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func newOrSkip(t testing.TB, key []byte) cipher.AEAD {
	g, ok := New(key)
	if !ok {
		t.Skip("this CPU lacks VAES, VPCLMULQDQ or AVX-512")
	}
	return g
}

// lengths are message lengths around every boundary of the assembly: a
// block, a register of four, an iteration of sixteen, and a record.
func lengths() []int {
	var n []int
	for i := 0; i <= 600; i++ {
		n = append(n, i)
	}
	for _, base := range []int{1 << 12, 64 << 10} {
		for d := -17; d <= 17; d++ {
			n = append(n, base+d)
		}
	}
	return n
}

func TestSealAndOpenAreCryptoCiphers(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 70<<10)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for _, n := range lengths() {
		for _, keyLen := range []int{16, 32} { // AES-256's texts go to crypto/cipher
			sealAndOpen(t, buf[n%97:][:keyLen], buf[n%89:][:12], buf[n%53:][:n], buf[n%61:][:rng.IntN(1200)])
		}
	}
}

// sealAndOpen checks that aesgcm seals plain as crypto/cipher does, after
// a prefix and in place, and opens it in place and into its own buffer.
func sealAndOpen(t *testing.T, key, nonce, plain, aad []byte) {
	t.Helper()
	n := len(plain)
	ours, std := newOrSkip(t, key), stdGCM(t, key)
	want := std.Seal([]byte("prefix"), nonce, plain, aad)
	got := ours.Seal([]byte("prefix"), nonce, plain, aad)
	if !bytes.Equal(got, want) {
		t.Fatalf("AES-%d, seal of %d bytes (aad %d): differs from crypto/cipher at byte %d", len(key)*8, n, len(aad), firstDiff(got, want))
	}
	// Sealed in place, as the records are.
	in := make([]byte, n, n+tagSize)
	copy(in, plain)
	if got := ours.Seal(in[:0], nonce, in, aad); !bytes.Equal(got, want[6:]) {
		t.Fatalf("AES-%d, seal in place of %d bytes: differs at byte %d", len(key)*8, n, firstDiff(got, want[6:]))
	}
	// Opened in place, as the records are, and into a buffer of its own.
	for _, inPlace := range []bool{true, false} {
		ct := bytes.Clone(want[6:])
		var dst []byte
		if inPlace {
			dst = ct[:0]
		}
		out, err := ours.Open(dst, nonce, ct, aad)
		if err != nil {
			t.Fatalf("AES-%d, open of %d bytes: %v", len(key)*8, n, err)
		}
		if !bytes.Equal(out, plain) {
			t.Fatalf("AES-%d, open of %d bytes: differs from the plaintext at byte %d", len(key)*8, n, firstDiff(out, plain))
		}
	}
}

// The integrity mode's tags (GMAC: additional data alone), under both
// key sizes, at every length boundary.
func TestTagsOfAdditionalDataAreCryptoCiphers(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	aad := make([]byte, 70<<10)
	for i := range aad {
		aad[i] = byte(rng.Uint32())
	}
	for _, keyLen := range []int{16, 32} {
		key, nonce := aad[keyLen:2*keyLen], aad[100:112]
		ours, std := newOrSkip(t, key), stdGCM(t, key)
		for _, n := range lengths() {
			a := aad[n%7 : n%7+n]
			want := std.Seal(nil, nonce, nil, a)
			got := ours.Seal(nil, nonce, nil, a)
			if !bytes.Equal(got, want) {
				t.Fatalf("AES-%d, a tag of %d bytes: differs from crypto/cipher's", keyLen*8, n)
			}
			if _, err := ours.Open(nil, nonce, got, a); err != nil {
				t.Fatalf("AES-%d, a tag of %d bytes: %v", keyLen*8, n, err)
			}
			if n > 0 {
				bad := bytes.Clone(a)
				bad[n/2] ^= 4
				if _, err := ours.Open(nil, nonce, got, bad); err == nil {
					t.Fatalf("AES-%d, %d bytes: a changed byte was accepted", keyLen*8, n)
				}
			}
		}
	}
}

func TestOverlapsPanicAsCryptoCiphers(t *testing.T) {
	g := newOrSkip(t, make([]byte, 16))
	nonce := make([]byte, 12)
	buf := make([]byte, 200)
	for name, f := range map[string]func(){
		"seal over its plaintext, shifted":  func() { g.Seal(buf[1:1], nonce, buf[:100], nil) },
		"seal over its additional data":     func() { g.Seal(buf[:0], nonce, buf[150:160], buf[:100]) },
		"open over its ciphertext, shifted": func() { g.Open(buf[1:1], nonce, buf[:100], nil) },
		"open over its additional data":     func() { g.Open(buf[:0], nonce, buf[150:190], buf[:10]) },
		"a nonce of 8 bytes":                func() { g.Seal(nil, nonce[:8], nil, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestOpenRefusesEveryTamperedByte(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 16)
	g := newOrSkip(t, key)
	nonce := make([]byte, 12)
	for _, n := range []int{0, 1, 15, 16, 63, 64, 255, 256, 300} {
		plain := bytes.Repeat([]byte{0xab}, n)
		aad := []byte("header")
		ct := g.Seal(nil, nonce, plain, aad)
		for i := range ct {
			bad := bytes.Clone(ct)
			bad[i] ^= 0x10
			dst := make([]byte, 0, n)
			if _, err := g.Open(dst, nonce, bad, aad); err == nil {
				t.Fatalf("%d bytes: a flipped bit at byte %d was accepted", n, i)
			}
			if n > 0 && !bytes.Equal(dst[:n], make([]byte, n)) {
				t.Fatalf("%d bytes: a refused open left plaintext behind", n)
			}
		}
		if _, err := g.Open(nil, nonce, ct, []byte("headex")); err == nil {
			t.Fatalf("%d bytes: other additional data was accepted", n)
		}
		other := bytes.Clone(nonce)
		other[11] = 1
		if _, err := g.Open(nil, other, ct, aad); err == nil {
			t.Fatalf("%d bytes: another nonce was accepted", n)
		}
	}
	if _, err := g.Open(nil, nonce, make([]byte, 15), nil); err == nil {
		t.Fatal("a message shorter than a tag was accepted")
	}
}

func TestCounterWrapsInItsLowWord(t *testing.T) {
	// A nonce is 12 bytes, so the counter starts at 2 and a message
	// cannot wrap it; the wrap is the 32-bit increment's, checked here
	// through a counter block set by hand.
	key := bytes.Repeat([]byte{3}, 16)
	g := newOrSkip(t, key).(*gcm)
	b, _ := aes.NewCipher(key)
	ctr := [16]byte{15: 0xfe, 14: 0xff, 13: 0xff, 12: 0xff, 0: 9}
	src := make([]byte, 300)
	dst := make([]byte, 300)
	var acc [16]byte
	sealBulk(&g.rk, &g.htab, &ctr, &acc, dst, src)
	want := make([]byte, 300)
	cb := ctr
	for off := 0; off < len(want); off += 16 {
		var ks [16]byte
		b.Encrypt(ks[:], cb[:])
		copy(want[off:], ks[:])
		for i := 15; i >= 12; i-- {
			cb[i]++
			if cb[i] != 0 {
				break
			}
		}
	}
	if !bytes.Equal(dst, want) {
		t.Fatalf("keystream differs at byte %d", firstDiff(dst, want))
	}
}

func TestKeyScheduleIsFIPS197s(t *testing.T) {
	if !available {
		t.Skip("no assembly")
	}
	key, _ := hex.DecodeString("2b7e151628aed2a6abf7158809cf4f3c")
	var rk [176]byte
	expandKey128(&rk, (*[16]byte)(key))
	// FIPS-197, appendix A.1: the expanded key, a round key a line.
	want := "2b7e151628aed2a6abf7158809cf4f3c" +
		"a0fafe1788542cb123a339392a6c7605" +
		"f2c295f27a96b9435935807a7359f67f" +
		"3d80477d4716fe3e1e237e446d7a883b" +
		"ef44a541a8525b7fb671253bdb0bad00" +
		"d4d1c6f87c839d87caf2b8bc11f915bc" +
		"6d88a37a110b3efddbf98641ca0093fd" +
		"4e54f70e5f5fc9f384a64fb24ea6dc4f" +
		"ead27321b58dbad2312bf5607f8d292f" +
		"ac7766f319fadc2128d12941575c006e" +
		"d014f9a8c9ee2589e13f0cc8b6630ca6"
	if got := hex.EncodeToString(rk[:]); got != want {
		t.Fatalf("round keys\n%s, want\n%s", got, want)
	}
}

// ghashSpec is GHASH as NIST SP 800-38D's algorithm 1 and 2 define it,
// one bit at a time.
func ghashSpec(h [16]byte, data []byte) [16]byte {
	mulSpec := func(x, y [16]byte) [16]byte {
		var z [16]byte
		v := y
		for i := range 128 {
			if x[i/8]>>(7-i%8)&1 == 1 {
				for j := range z {
					z[j] ^= v[j]
				}
			}
			lsb := v[15] & 1
			for j := 15; j > 0; j-- {
				v[j] = v[j]>>1 | v[j-1]<<7
			}
			v[0] >>= 1
			if lsb == 1 {
				v[0] ^= 0xe1
			}
		}
		return z
	}
	var y [16]byte
	for len(data) > 0 {
		var blk [16]byte
		data = data[copy(blk[:], data):]
		for j := range y {
			y[j] ^= blk[j]
		}
		y = mulSpec(y, h)
	}
	return y
}

func TestFieldModelIsGHASH(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		var h [16]byte
		for i := range h {
			h[i] = byte(rng.Uint32())
		}
		data := make([]byte, 16*(1+rng.IntN(20)))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		hp := keyPowers(h, 1)[0]
		var y elem
		for off := 0; off < len(data); off += 16 {
			x := load((*[16]byte)(data[off:]))
			y = mul(elem{y.lo ^ x.lo, y.hi ^ x.hi}, hp)
		}
		want := ghashSpec(h, data)
		if got := load(&want); got != y {
			t.Fatalf("model %x, spec %x", y, got)
		}
		if available {
			g := &gcm{}
			for i, p := range keyPowers(h, powers) {
				p.put(&g.htab[powers-1-i])
			}
			var acc [16]byte
			ghashData(&g.htab, &acc, data)
			var yb [16]byte
			y.put(&yb)
			if acc != yb {
				t.Fatalf("assembly %x, model %x", acc, yb)
			}
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func BenchmarkRecord(b *testing.B) {
	key := make([]byte, 16)
	plain := make([]byte, 64<<10)
	nonce := make([]byte, 12)
	impls := map[string]cipher.AEAD{"crypto-cipher": stdGCM(b, key)}
	if g, ok := New(key); ok {
		impls["vaes"] = g
	}
	tagKey := make([]byte, 32)
	tags := map[string]cipher.AEAD{"crypto-cipher": stdGCM(b, tagKey)}
	if g, ok := New(tagKey); ok {
		tags["vaes"] = g
	}
	for name, a := range tags {
		out := make([]byte, 0, 16)
		b.Run("tag-aes256/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(plain)))
			for b.Loop() {
				out = a.Seal(out[:0], nonce, nil, plain)
			}
		})
	}
	for name, a := range impls {
		out := make([]byte, 0, len(plain)+16)
		b.Run("seal/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(plain)))
			for b.Loop() {
				out = a.Seal(out[:0], nonce, plain, nil)
			}
		})
		ct := a.Seal(nil, nonce, plain, nil)
		b.Run("open/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(plain)))
			for b.Loop() {
				if _, err := a.Open(out[:0], nonce, ct, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzAgainstCryptoCipher seals and opens what the fuzzer chooses with
// both implementations: the same bytes, and the same verdict on a
// changed message.
func FuzzAgainstCryptoCipher(f *testing.F) {
	f.Add(make([]byte, 16), make([]byte, 12), []byte("plaintext"), []byte("aad"), uint16(3))
	f.Add(make([]byte, 32), make([]byte, 12), []byte(nil), bytes.Repeat([]byte{5}, 700), uint16(7))
	f.Add(bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 12), bytes.Repeat([]byte{3}, 1000), []byte(nil), uint16(999))
	f.Fuzz(func(t *testing.T, key, nonce, plain, aad []byte, flip uint16) {
		if (len(key) != 16 && len(key) != 32) || len(nonce) != 12 {
			return
		}
		ours, std := newOrSkip(t, key), stdGCM(t, key)
		want := std.Seal(nil, nonce, plain, aad)
		got := ours.Seal(nil, nonce, plain, aad)
		if !bytes.Equal(got, want) {
			t.Fatalf("seal differs at byte %d", firstDiff(got, want))
		}
		bad := bytes.Clone(want)
		bad[int(flip)%len(bad)] ^= 1
		_, errOurs := ours.Open(nil, nonce, bad, aad)
		_, errStd := std.Open(nil, nonce, bad, aad)
		if (errOurs == nil) != (errStd == nil) || errOurs == nil {
			t.Fatalf("a changed byte: ours %v, crypto/cipher %v", errOurs, errStd)
		}
	})
}
