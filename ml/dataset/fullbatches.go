package dataset

import "fmt"

// FullBatches is a worker's stream of batches over its data shard: the
// Batcher's order without the short last batch of each epoch (like
// drop_remainder), so that every batch has exactly B samples and the
// model's graph keeps one shape. Batches are numbered by position 0, 1,
// 2, ... across epochs; a worker's data position (how many of its batches
// the model holds) is such a number, and SeekBatch goes back to it.
//
// With F = floor(N/B) full batches per epoch, position p is batch
// k = p mod F of epoch e = p / F, which is the Batcher's step e*K + k
// (K = ceil(N/B) steps per epoch). Every epoch uses each sample at most
// once, and all of them when B divides N; the N mod B samples the
// epoch's permutation puts last sit the epoch out.
//
// A shard smaller than one batch (0 < N < B) has one batch per epoch: the
// epoch's permutation of all N samples, repeated to fill B (so each
// sample is in it floor(B/N) or ceil(B/N) times). An empty shard has one
// batch per epoch that leaves x and y as they were.
//
// A FullBatches is not safe for concurrent use.
type FullBatches struct {
	b        *Batcher
	perEpoch int64 // F, or 1 for a shard smaller than a batch
	pos      int64
}

// NewFullBatches returns the full batches of b's order, positioned at 0.
func NewFullBatches(b *Batcher) *FullBatches {
	return &FullBatches{b: b, perEpoch: max(1, int64(b.n/b.batch))}
}

// Next copies the batch at the current position into x (B*Dim values) and
// y (B labels) and moves to the next position. It panics if the buffers
// are smaller.
func (f *FullBatches) Next(x []float32, y []uint8) {
	b := f.b
	b.checkBuffers("FullBatches", x, y)
	e, k := f.pos/f.perEpoch, f.pos%f.perEpoch
	f.pos++
	b.fullBatch(e*b.perEpoch+k, x, y)
}

// checkBuffers panics if x and y cannot hold a batch (who names the
// caller).
func (b *Batcher) checkBuffers(who string, x []float32, y []uint8) {
	B, d := b.batch, b.dim
	if len(x) < B*d || len(y) < B {
		panic(fmt.Sprintf("data: %s.Next: buffers hold %d values and %d labels, need %d and %d", who, len(x), len(y), B*d, B))
	}
}

// fullBatch copies batch step of b's order into x and y, repeating the
// shard's samples when the shard is smaller than a batch (an empty shard
// leaves the buffers alone).
func (b *Batcher) fullBatch(step int64, x []float32, y []uint8) {
	if b.n == 0 {
		return
	}
	b.SeekStep(step)
	n, _ := b.Next(x, y)
	d := b.dim
	for i := n; i < b.batch; i++ { // only a shard smaller than a batch
		j := i % n
		copy(x[i*d:(i+1)*d], x[j*d:(j+1)*d])
		y[i] = y[j]
	}
}

// SeekBatch makes position the next batch, as if position batches had
// been taken. It panics if position < 0. (Not Seek: go vet wants a Seek
// method to be io.Seeker's.)
func (f *FullBatches) SeekBatch(position int64) {
	if position < 0 {
		panic(fmt.Sprintf("data: FullBatches.SeekBatch(%d): negative position", position))
	}
	f.pos = position
}

// Position is the position of the batch Next returns next.
func (f *FullBatches) Position() int64 { return f.pos }

// PerEpoch is the number of batches per epoch: floor(N/B), or 1 for a
// shard smaller than a batch.
func (f *FullBatches) PerEpoch() int64 { return f.perEpoch }

// Epoch is the epoch of the batch Next returns next.
func (f *FullBatches) Epoch() int64 { return f.pos / f.perEpoch }
