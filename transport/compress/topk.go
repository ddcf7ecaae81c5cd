package compress

import (
	"encoding/binary"
	"math"
)

// topK sends the k = ceil(fraction*n) coordinates of largest magnitude:
// k little-endian uint32 indices in increasing order, then their k
// float32 values. The values are sent as they are, so a decoded
// coordinate is exact and the others are 0; the residual keeps the
// unsent coordinates whole.
type topK struct {
	fraction float64
}

func (topK) Kind() Kind { return TopK }

// k is how many coordinates of n are sent: at least one of a non-empty
// vector, at most all.
func (c topK) k(n int) int {
	k := int(math.Ceil(c.fraction * float64(n)))
	return max(min(k, n), min(n, 1))
}

func (c topK) EncodedLen(n int) int { return 8 * c.k(n) }

func (c topK) encode(dst []byte, acc, scratch []float32) {
	k := c.k(len(acc))
	if k == 0 {
		return
	}
	mags := scratch[:len(acc)]
	above := 0 // coordinates above the threshold
	for i, v := range acc {
		mags[i] = abs(v)
	}
	t := kthLargest(mags, k)
	for _, v := range acc {
		if abs(v) > t {
			above++
		}
	}
	ties := k - above // of the coordinates at the threshold, the first ties go
	idx, vals := dst[:4*k], dst[4*k:8*k]
	j := 0
	for i, v := range acc {
		a := abs(v)
		if a < t || (a == t && ties == 0) {
			continue
		}
		if a == t {
			ties--
		}
		binary.LittleEndian.PutUint32(idx[4*j:], uint32(i))
		binary.LittleEndian.PutUint32(vals[4*j:], math.Float32bits(v))
		acc[i] = 0
		j++
	}
}

func (c topK) poison(dst []byte, n int) {
	k := c.k(n)
	for j := range k {
		binary.LittleEndian.PutUint32(dst[4*j:], uint32(j))
		binary.LittleEndian.PutUint32(dst[4*(k+j):], math.Float32bits(float32(math.NaN())))
	}
}

func (c topK) Decode(dst []float32, src []byte) error {
	n := len(dst)
	if err := checkLen(c, n, src); err != nil {
		return err
	}
	clear(dst)
	k := c.k(n)
	prev := -1
	for j := range k {
		i := int(binary.LittleEndian.Uint32(src[4*j:]))
		if i <= prev || i >= n {
			return malformed("topk: index %d (entry %d) after %d, of %d values: indices must increase and be below the length", i, j, prev, n)
		}
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*(k+j):]))
		prev = i
	}
	return nil
}

func abs(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }
