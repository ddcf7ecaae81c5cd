package compress

import (
	"math/bits"
	"slices"
)

// kthLargest returns the k-th largest of a (1 <= k <= len(a), no NaN),
// reordering a. Quickselect with a median-of-three pivot and a
// three-way partition (runs of equal values, such as the zeros of a
// sparse gradient, end a round at once): O(len(a)) expected; after
// 2*log2(len(a)) rounds without an answer it sorts what is left, so it
// is never worse than O(n log n).
func kthLargest(a []float32, k int) float32 {
	want := len(a) - k // its index in ascending order
	lo, hi := 0, len(a)
	for budget := 2 * bits.Len(uint(len(a))); hi-lo > 1; budget-- {
		if budget == 0 {
			slices.Sort(a[lo:hi])
			break
		}
		lt, gt := partition3(a[lo:hi], pivot(a[lo:hi]))
		switch {
		case want < lo+lt:
			hi = lo + lt
		case want >= lo+gt:
			lo += gt
		default:
			return a[want]
		}
	}
	return a[want]
}

// pivot is the median of a's first, middle and last values.
func pivot(a []float32) float32 {
	x, y, z := a[0], a[len(a)/2], a[len(a)-1]
	if x > y {
		x, y = y, x
	}
	if y > z {
		y = z
	}
	return max(x, y)
}

// partition3 reorders a into values below p, equal to p and above p, and
// returns where the equal ones start and end.
func partition3(a []float32, p float32) (lt, gt int) {
	i := 0
	gt = len(a)
	for i < gt {
		switch v := a[i]; {
		case v < p:
			a[lt], a[i] = a[i], a[lt]
			lt++
			i++
		case v > p:
			gt--
			a[gt], a[i] = a[i], a[gt]
		default:
			i++
		}
	}
	return lt, gt
}
