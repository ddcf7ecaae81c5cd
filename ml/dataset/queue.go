package dataset

import (
	"fmt"
	"slices"
)

// The data queue (docs/elastic.md, "The data queue"): in an async or
// ssp run no worker waits for another, so with a fixed shard each a
// slower worker falls behind in the epochs while the faster ones read
// their shards again and again. With a queue, every epoch is one
// permutation of the whole training set (seed --seed), cut into chunks
// of Chunk full batches; the chief hands the chunks out in order, a few
// at a time, to each worker as it reads (Lease). A worker reads its
// chunks in the order it was handed them, so its data position (the
// number of its batches the model holds) still names one batch for
// good: batch pos%Chunk of its chunk pos/Chunk. A slower worker is
// handed fewer chunks; every epoch is read once, by whoever is there.

// Queued says the plan is a queue: Chunk > 0. Its eras then only
// count the workers (who may be handed chunks); every member reads the
// whole training set through its leases.
func (p DataPlan) Queued() bool { return p.Chunk > 0 }

// ChunksPerEpoch is the chunks of one epoch: the epoch's full batches
// over Chunk, at least 1 (the remainder, fewer than Chunk batches, is
// not read, as a shard's last partial batch is not).
func (p DataPlan) ChunksPerEpoch() int64 {
	return max(1, int64(p.N/p.Batch/p.Chunk))
}

// QueueChunk is the chunk size a queue over n samples in batches of
// batch uses: a hundredth of an epoch's batches, 1 to 4, so a worker
// is handed work in pieces of a few tens of milliseconds and an epoch
// drops fewer than 4 of its batches.
func QueueChunk(n, batch int) int {
	return min(4, max(1, n/max(1, batch)/100))
}

// NewQueuePlan is the queue plan of a run that starts with workers
// workers, none handed a chunk yet.
func NewQueuePlan(n, batch, workers int) DataPlan {
	p := NewDataPlan(n, batch, workers)
	p.Chunk = QueueChunk(n, batch)
	return p
}

// Lease is a run of Count consecutive chunks of the queue, from chunk
// First, handed to one worker.
type Lease struct {
	First int64 `json:"first"`
	Count int64 `json:"count"`
}

// chunks is how many chunks the leases hold.
func chunks(ls []Lease) int64 {
	var n int64
	for _, l := range ls {
		n += l.Count
	}
	return n
}

// LeasedChunks is the number of chunks worker w was handed.
func (p DataPlan) LeasedChunks(w int) int64 {
	if w < 0 || w >= len(p.Leases) {
		return 0
	}
	return chunks(p.Leases[w])
}

// Leased is the data position after worker w's last chunk: its leased
// batches.
func (p DataPlan) Leased(w int) int64 {
	return p.LeasedChunks(w) * int64(p.Chunk)
}

// Lease is the plan with n more chunks handed to worker w, the next n
// of the queue. The plan's leases are not changed in place: a plan
// handed out before stays as it was.
func (p DataPlan) Lease(w, n int) DataPlan {
	q := p
	q.Leases = slices.Clone(p.Leases)
	for len(q.Leases) <= w {
		q.Leases = append(q.Leases, nil)
	}
	mine := slices.Clone(q.Leases[w])
	if k := len(mine) - 1; k >= 0 && mine[k].First+mine[k].Count == q.NextChunk {
		mine[k].Count += int64(n)
	} else {
		mine = append(mine, Lease{First: q.NextChunk, Count: int64(n)})
	}
	q.NextChunk += int64(n)
	q.Leases[w] = mine
	return q
}

// ForWorker is the plan worker w is sent: its own leases only (the
// others' are of no use to it, and grow all run).
func (p DataPlan) ForWorker(w int) DataPlan {
	if !p.Queued() {
		return p
	}
	q := p
	q.Leases = nil
	if w < len(p.Leases) {
		q.Leases = make([][]Lease, w+1)
		q.Leases[w] = p.Leases[w]
	}
	return q
}

// locateQueued is Locate for a queue: the chunk worker w was handed
// at index pos/Chunk, and the batch in its epoch. It looks from the
// newest lease back: a worker reads near its newest.
func (p DataPlan) locateQueued(w int, pos int64) (epoch, batch int64, ok bool) {
	if pos < 0 || w < 0 || w >= len(p.Leases) {
		return 0, 0, false
	}
	j := pos / int64(p.Chunk)
	ls := p.Leases[w]
	end := chunks(ls)
	for k := len(ls) - 1; k >= 0; k-- {
		end -= ls[k].Count
		if j >= end {
			if j-end >= ls[k].Count {
				return 0, 0, false // past its last chunk
			}
			c, per := ls[k].First+j-end, p.ChunksPerEpoch()
			return c / per, c%per*int64(p.Chunk) + pos%int64(p.Chunk), true
		}
	}
	return 0, 0, false
}

// validateQueue reports a queue plan no worker could follow.
func (p DataPlan) validateQueue() error {
	if !p.Queued() {
		if len(p.Leases) > 0 || p.NextChunk != 0 {
			return fmt.Errorf("data plan: leases without a chunk size")
		}
		return nil
	}
	if p.Hold != 0 {
		return fmt.Errorf("data plan: a queue with a hold (epoch %d)", p.Hold)
	}
	for w, ls := range p.Leases {
		for _, l := range ls {
			if l.First < 0 || l.Count < 1 || l.First+l.Count > p.NextChunk {
				return fmt.Errorf("data plan: worker %d holds chunks %d-%d, the queue handed out %d", w, l.First, l.First+l.Count-1, p.NextChunk)
			}
		}
	}
	return nil
}
