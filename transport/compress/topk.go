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
	t, above := threshold(acc, k, scratch)
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

// sampleLen is how many magnitudes threshold samples to guess a bound
// below the k-th largest.
const sampleLen = 4096

// threshold returns the k-th largest magnitude t of acc and how many
// magnitudes are above it. With few coordinates to send, it first
// guesses a bound below t from an evenly spaced sample (one that keeps
// twice the sample's share of k, and 16 more) and selects among the
// magnitudes at or above the bound only, a small fraction of acc; if
// fewer than k are, the guess was too high and it selects among all.
func threshold(acc []float32, k int, scratch []float32) (float32, int) {
	n := len(acc)
	cand := scratch[:0]
	if n >= 4*sampleLen && k <= n/16 {
		sample := scratch[:sampleLen]
		for j := range sample {
			sample[j] = abs(acc[j*(n/sampleLen)])
		}
		keep := min(sampleLen, 2*k*sampleLen/n+16)
		bound := kthLargest(sample, keep)
		for _, v := range acc {
			if a := abs(v); a >= bound {
				cand = append(cand, a)
			}
		}
	}
	if len(cand) < k {
		cand = scratch[:n]
		for i, v := range acc {
			cand[i] = abs(v)
		}
	}
	t := kthLargest(cand, k)
	above := 0
	for _, a := range cand {
		if a > t {
			above++
		}
	}
	return t, above
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
