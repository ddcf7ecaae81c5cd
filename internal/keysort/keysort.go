// Package keysort sorts embedding rows by key: a table's keys with each
// row's slot, as a checkpoint writes them. A least-significant-digit
// radix sort, a byte a pass, skipping the bytes every key shares (a
// vocabulary's ids leave the high bytes zero): on millions of keys it
// takes a fraction of a comparison sort's time, which a checkpoint of a
// large table pays on its writer's critical path.
package keysort

// smallSort is the length below which an insertion sort is used.
const smallSort = 64

// Pairs sorts keys increasing, moving at[i] with keys[i]. keys must be
// distinct (a table's are) or their order among equals is kept: the
// sort is stable. len(at) must be len(keys).
func Pairs(keys []uint64, at []int32) {
	n := len(keys)
	if len(at) != n {
		panic("keysort: keys and slots of different lengths")
	}
	if n < smallSort {
		insertion(keys, at)
		return
	}
	var counts [8][256]int
	for _, k := range keys {
		for d := range 8 {
			counts[d][byte(k>>(8*d))]++
		}
	}
	src, srcAt := keys, at
	dst, dstAt := make([]uint64, n), make([]int32, n)
	for d := range 8 {
		c := &counts[d]
		if c[byte(keys[0]>>(8*d))] == n {
			continue // every key has this byte
		}
		sum := 0
		for b := range c {
			c[b], sum = sum, sum+c[b]
		}
		shift := 8 * d
		for i, k := range src {
			j := c[byte(k>>shift)]
			c[byte(k>>shift)]++
			dst[j], dstAt[j] = k, srcAt[i]
		}
		src, dst = dst, src
		srcAt, dstAt = dstAt, srcAt
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
		copy(at, srcAt)
	}
}

// insertion is Pairs by insertion, for short slices.
func insertion(keys []uint64, at []int32) {
	for i := 1; i < len(keys); i++ {
		k, a := keys[i], at[i]
		j := i
		for ; j > 0 && keys[j-1] > k; j-- {
			keys[j], at[j] = keys[j-1], at[j-1]
		}
		keys[j], at[j] = k, a
	}
}
