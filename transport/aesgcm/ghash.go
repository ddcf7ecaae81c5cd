package aesgcm

import "encoding/binary"

// GHASH's field, as the assembly computes in it. A block is read
// byte-reversed, as a little-endian 128-bit integer: bit 127 is the
// coefficient of x^0 (the first byte's top bit), bit 0 that of x^127.
// In this form a carry-less product of two elements is their field
// product divided by x, so the key H is multiplied by x once ("doubled")
// and every power of it kept that way: a product with such a power then
// needs no shift. A 256-bit product is reduced with two carry-less
// multiplications by the top of GCM's polynomial x^128+x^7+x^2+x+1
// written in this form (0xc2 followed by zeros, and the 1 in bit 0).

// elem is a field element in the form above.
type elem struct{ lo, hi uint64 }

// polyTop is the reduction's constant: the polynomial's low terms in
// the reversed form, shifted as the product is.
const polyTop = 0xc200000000000000

// load reads block b into the form above.
func load(b *[16]byte) elem {
	return elem{lo: binary.BigEndian.Uint64(b[8:]), hi: binary.BigEndian.Uint64(b[:8])}
}

// put writes e as the assembly reads an element: lo's bytes first, each
// word little-endian.
func (e elem) put(b *[16]byte) {
	binary.LittleEndian.PutUint64(b[:8], e.lo)
	binary.LittleEndian.PutUint64(b[8:], e.hi)
}

// clmul64 is the carry-less product of a and b, in constant time.
func clmul64(a, b uint64) (hi, lo uint64) {
	for i := range 64 {
		m := -(b >> i & 1)
		lo ^= a << i & m
		hi ^= a >> (64 - i) & m
	}
	return hi, lo
}

// mul is a x b / x reduced: with b a doubled element (double, or a
// product of doubled ones), the field product of a and the element b
// was doubled from.
func mul(a, b elem) elem {
	l1, l0 := clmul64(a.lo, b.lo)
	h1, h0 := clmul64(a.hi, b.hi)
	ma1, ma0 := clmul64(a.lo, b.hi)
	mb1, mb0 := clmul64(a.hi, b.lo)
	m1, m0 := ma1^mb1, ma0^mb0
	lo := elem{lo: l0, hi: l1 ^ m0}
	hi := elem{lo: h0 ^ m1, hi: h1}
	lo = reduceRound(reduceRound(lo))
	return elem{lo: lo.lo ^ hi.lo, hi: lo.hi ^ hi.hi}
}

// reduceRound folds the low half of the product's low 128 bits into its
// high half: one of the reduction's two rounds.
func reduceRound(a elem) elem {
	th, tl := clmul64(a.lo, polyTop)
	return elem{lo: a.hi ^ tl, hi: a.lo ^ th}
}

// double is h x x in the form above: a shift left by one, the bit
// shifted out folded back with the polynomial.
func double(h elem) elem {
	m := -(h.hi >> 63)
	return elem{
		lo: h.lo<<1 ^ 1&m,
		hi: (h.hi<<1 | h.lo>>63) ^ polyTop&m,
	}
}

// keyPowers are H^1 .. H^n for the hash key block h (E(K, 0)), doubled.
func keyPowers(h [16]byte, n int) []elem {
	p := make([]elem, n)
	p[0] = double(load(&h))
	for i := 1; i < n; i++ {
		p[i] = mul(p[i-1], p[0])
	}
	return p
}
