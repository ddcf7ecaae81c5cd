package dataset

import (
	"fmt"
	"math/bits"
)

// Permutation returns a pseudo-random permutation of [0, n) that depends only
// on (n, seed), on every platform and Go version. The algorithm is fixed, so
// other code can rely on the exact order:
//
//  1. p = [0, 1, ..., n-1].
//  2. A SplitMix64 generator is seeded with state = uint64(seed). Each draw
//     adds 0x9e3779b97f4a7c15 to state (mod 2^64) and returns
//     z ^ (z >> 31), where z = state; z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
//     z = (z ^ (z >> 27)) * 0x94d049bb133111eb (all mod 2^64).
//  3. For i = n-1 down to 1: j = uniform(i+1); swap p[i] and p[j]
//     (Fisher–Yates).
//
// uniform(m) is Lemire's multiply-and-reject method: draw x and take the
// 128-bit product x*m = hi*2^64 + lo; while lo < (2^64 - m) mod m, draw a
// fresh x and recompute; the result is hi.
func Permutation(n int, seed int64) []int {
	p := make([]int, n)
	fillPermutation(p, seed)
	return p
}

// fillPermutation writes Permutation(len(p), seed) into p without allocating.
func fillPermutation(p []int, seed int64) {
	for i := range p {
		p[i] = i
	}
	rng := splitMix64{state: uint64(seed)}
	for i := len(p) - 1; i > 0; i-- {
		j := rng.uniform(uint64(i + 1))
		p[i], p[j] = p[j], p[i]
	}
}

// splitMix64 is Steele, Lea and Flood's SplitMix64 generator.
type splitMix64 struct{ state uint64 }

func (s *splitMix64) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform returns a uniformly distributed value in [0, m), m > 0.
func (s *splitMix64) uniform(m uint64) uint64 {
	hi, lo := bits.Mul64(s.next(), m)
	if lo < m {
		thresh := -m % m
		for lo < thresh {
			hi, lo = bits.Mul64(s.next(), m)
		}
	}
	return hi
}

// Batcher iterates over a data set (a Dataset, a TrainShard: any Samples)
// in mini-batches, epoch after epoch, in a deterministic order.
//
// # Order
//
// Let B be the batch size, N the number of samples and K = ceil(N/B) the
// number of steps per epoch (K = 1 when N = 0). Steps are numbered 0, 1, 2,
// ... across epochs; step s belongs to epoch e = s / K and is batch k = s % K
// of that epoch. Epoch e visits the samples in the order
// P_e = Permutation(N, seed+e) (seed+e computed in int64, wrapping), and
// batch k of epoch e holds samples P_e[k*B : min((k+1)*B, N)], in that order.
// The last batch of an epoch is short when B does not divide N; no sample is
// dropped or repeated within an epoch. Two Batchers built from data sets
// with equal samples with the same (batch, seed) therefore produce identical sequences, and
// SeekStep(s) makes the next batch the one at step s, exactly as if s batches had
// been taken.
//
// A Batcher is not safe for concurrent use; the data set is only read.
type Batcher struct {
	ds        Samples
	n, dim    int // ds.Shape()
	batch     int
	seed      int64
	perEpoch  int64
	step      int64 // step of the next batch
	permEpoch int64 // epoch that perm currently holds; -1 for none
	perm      []int
}

// NewBatcher returns a Batcher over ds with batch size batch (> 0) whose
// order is derived from seed, positioned at step 0. It panics if batch <= 0.
func NewBatcher(ds Samples, batch int, seed int64) *Batcher {
	if batch <= 0 {
		panic(fmt.Sprintf("data: NewBatcher: batch size %d <= 0", batch))
	}
	n, dim := ds.Shape()
	perEpoch := int64((n + batch - 1) / batch)
	if perEpoch == 0 {
		perEpoch = 1
	}
	return &Batcher{
		ds:        ds,
		n:         n,
		dim:       dim,
		batch:     batch,
		seed:      seed,
		perEpoch:  perEpoch,
		permEpoch: -1,
		perm:      make([]int, n),
	}
}

// Next copies the batch at the current step into x (n*Dim values) and y (n
// labels), advances to the next step, and returns the number of samples n
// (B, or fewer for the last batch of an epoch; 0 only for an empty data set)
// and the epoch the batch belongs to. Entries of x and y past n are left
// untouched. Next never allocates: at an epoch boundary the permutation is
// regenerated in a buffer owned by the Batcher. It panics if
// len(x) < min(B, N)*Dim or len(y) < min(B, N).
func (b *Batcher) Next(x []float32, y []uint8) (n int, epoch int) {
	d := b.dim
	full := min(b.batch, b.n)
	if len(x) < full*d || len(y) < full {
		panic(fmt.Sprintf("data: Batcher.Next: buffers hold %d values and %d labels, need %d and %d",
			len(x), len(y), full*d, full))
	}
	e, k := b.step/b.perEpoch, b.step%b.perEpoch
	if e != b.permEpoch {
		fillPermutation(b.perm, b.seed+e)
		b.permEpoch = e
	}
	lo := int(k) * b.batch
	hi := min(lo+b.batch, b.n)
	for i, j := range b.perm[lo:hi] {
		y[i] = b.ds.Sample(j, x[i*d:(i+1)*d])
	}
	b.step++
	return hi - lo, int(e)
}

// SeekStep positions the Batcher so that the next call to Next returns the
// batch at global step step (counting from 0 across epochs). A restarted
// worker that had consumed s batches calls SeekStep(s) to continue where it
// stopped. It panics if step < 0. (It is not called Seek because go vet
// requires a method named Seek to have io.Seeker's signature.)
func (b *Batcher) SeekStep(step int64) {
	if step < 0 {
		panic(fmt.Sprintf("data: Batcher.SeekStep(%d): negative step", step))
	}
	b.step = step
}

// Step returns the step of the batch the next call to Next will return.
func (b *Batcher) Step() int64 { return b.step }

// Epoch returns the epoch of the batch the next call to Next will return.
func (b *Batcher) Epoch() int { return int(b.step / b.perEpoch) }

// StepsPerEpoch returns K = ceil(N/B), or 1 for an empty data set.
func (b *Batcher) StepsPerEpoch() int64 { return b.perEpoch }

// BatchSize returns B.
func (b *Batcher) BatchSize() int { return b.batch }
