package dataset

import (
	"math"
	"math/rand/v2"
	"slices"
)

// Sample draws stratified samples of a labelled set: each class's indices
// in an order shuffled once from a seed, so a fraction of the set is the
// first round(fraction x count) of every class. The same labels and seed
// give the same samples; a smaller fraction's sample is part of a larger
// one's; and each class is in a sample in proportion to its share of the
// set, so a sample's accuracy is an unbiased estimate of the whole set's
// (over seeds), with a spread below a simple random sample's.
type Sample struct {
	perClass [][]int
	n        int
}

// NewSample shuffles the indices of each class of labels (labels at or
// above classes are grouped with none and never sampled) from seed.
func NewSample(labels []uint8, classes int, seed int64) Sample {
	s := Sample{perClass: make([][]int, classes), n: len(labels)}
	for i, l := range labels {
		if int(l) < classes {
			s.perClass[l] = append(s.perClass[l], i)
		}
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed5a3b1e))
	for _, idx := range s.perClass {
		rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	}
	return s
}

// Take returns, in ascending order, the indices of the sample holding
// fraction of the set (clamped to [0, 1]): round(fraction x n) of each
// class of n samples. Take(1) is every index of a class below classes.
// It is TakeAt(fraction, 0).
func (s Sample) Take(fraction float64) []int { return s.TakeAt(fraction, 0) }

// Rest returns, in ascending order, the indices of the set's classes
// that Take(fraction) leaves out: together they are Take(1).
func (s Sample) Rest(fraction float64) []int { return s.RestAt(fraction, 0) }

// TakeAt is the k-th sample of fraction of the set: in each class's
// shuffled order, the round(fraction x n) indices from position
// k x round(fraction x n) on, wrapping around at the class's end. Window 0
// is Take's; successive windows are disjoint until they have gone round
// the class (a fifth of the set: five windows, every index once), so
// successive samples are different images, each drawn as Take's is.
func (s Sample) TakeAt(fraction float64, k int) []int { return s.split(fraction, k, true) }

// RestAt returns, in ascending order, the indices of the set's classes
// that TakeAt(fraction, k) leaves out: together they are Take(1).
func (s Sample) RestAt(fraction float64, k int) []int { return s.split(fraction, k, false) }

func (s Sample) split(fraction float64, k int, head bool) []int {
	fraction = min(max(fraction, 0), 1)
	out := make([]int, 0, s.n)
	for _, idx := range s.perClass {
		n := len(idx)
		m := int(math.Round(fraction * float64(n)))
		if n == 0 || m >= n {
			if head {
				out = append(out, idx...)
			}
			continue
		}
		start := (max(k, 0) % n) * m % n
		for j := range n {
			// j steps past the window's start: in the window for j < m.
			if in := j < m; in == head {
				out = append(out, idx[(start+j)%n])
			}
		}
	}
	slices.Sort(out)
	return out
}
