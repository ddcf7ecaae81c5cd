package dataset

import (
	"slices"
	"testing"
)

// TestQueueReadsEveryEpochOnce: three workers of speeds 3, 1 and 2
// batches a tick read from a queue plan, each handed chunks while it has
// fewer than two unread (as the chief does); worker 2 is removed half
// way (no more chunks: it reads those it holds, then waits). Every
// epoch the workers completed holds each of its ChunksPerEpoch*Chunk
// batches' samples exactly once; the slow worker read about a third of
// the fast one's batches; and a worker set back to an earlier position
// (a restore) reads the same batches again.
func TestQueueReadsEveryEpochOnce(t *testing.T) {
	const n, batch = 1003, 4
	ds := idSet(n)
	load := func(i, c int) (Samples, error) { return ds.Shard(i, c), nil }
	plan := NewQueuePlan(n, batch, 3)
	plan.Chunk = 3 // (QueueChunk gives 2 for 250 batches; 3 leaves a remainder)
	if plan.ChunksPerEpoch() != 83 {
		t.Fatalf("%d chunks an epoch, want 83 (250 batches of 4 in chunks of 3)", plan.ChunksPerEpoch())
	}
	speeds := []int{3, 1, 2}
	srcs := make([]*ElasticBatches, 3)
	for w := range srcs {
		var err error
		if srcs[w], err = NewElasticBatches(w, 7, plan.ForWorker(w), load); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int64]map[int]int{} // epoch -> sample -> reads
	read := make([]int, 3)
	x, y := make([]float32, batch), make([]uint8, batch)
	for tick := range 900 {
		if tick == 450 {
			plan = plan.Scale(int64(tick), plan.NextChunk/plan.ChunksPerEpoch(), 2)
		}
		for w, src := range srcs {
			if w >= plan.Last().Workers {
				continue // removed: handed nothing more
			}
			if plan.Leased(w)-src.Position() < 2*int64(plan.Chunk) {
				plan = plan.Lease(w, 1)
				if err := src.SetPlan(plan.ForWorker(w)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for w, src := range srcs {
			for range speeds[w] {
				_, epoch, _, ok := plan.Locate(w, src.Position())
				if !ok {
					break
				}
				src.Next(x, y)
				read[w]++
				if seen[epoch] == nil {
					seen[epoch] = map[int]int{}
				}
				for _, v := range x {
					seen[epoch][int(v)]++
				}
			}
		}
	}
	last := plan.NextChunk / plan.ChunksPerEpoch() // the epoch being handed out
	if last < 5 {
		t.Fatalf("only %d epochs handed out", last)
	}
	for e := range last - 1 { // epochs whose chunks were all handed out and read
		if got, want := len(seen[e]), int(plan.ChunksPerEpoch())*plan.Chunk*batch; got != want {
			t.Errorf("epoch %d: %d samples read, want %d", e, got, want)
		}
		for s, k := range seen[e] {
			if k != 1 {
				t.Fatalf("epoch %d: sample %d read %d times", e, s, k)
			}
		}
	}
	if r := float64(read[1]) / float64(read[0]); r < 0.3 || r > 0.36 {
		t.Errorf("the slow worker read %d batches, the fast one %d: want about a third", read[1], read[0])
	}
	if end, ok := plan.Ends(2); !ok || end != plan.Leased(2) || srcs[2].Position() != end {
		t.Errorf("removed worker: at %d, ends at %d (%v), %d leased", srcs[2].Position(), end, ok, plan.Leased(2))
	}
	if _, ok := plan.Ends(1); ok {
		t.Error("worker 1 ends, a member")
	}
	// A restore sets worker 0 back 7 batches: it reads them again.
	again := make([]float32, batch)
	src := srcs[0]
	pos := src.Position() - 7
	src.SeekBatch(pos)
	src.Next(again, y)
	_, e, i, _ := plan.Locate(0, pos)
	fresh, _ := NewElasticBatches(0, 7, plan.ForWorker(0), load)
	fresh.SeekBatch(pos)
	fresh.Next(x, y)
	if !slices.Equal(x, again) {
		t.Errorf("position %d (epoch %d, batch %d) read %v, then %v by a new source", pos, e, i, again, x)
	}
}

// TestQueuePlanValidates refuses leases of chunks the queue has not
// handed out, and a hold in a queue.
func TestQueuePlanValidates(t *testing.T) {
	p := NewQueuePlan(6000, 10, 2).Lease(1, 3)
	if err := p.Validate(); err != nil || p.Leased(1) != 3*int64(p.Chunk) || p.Leased(0) != 0 {
		t.Fatalf("plan %+v: %v", p, err)
	}
	bad := p
	bad.Leases = [][]Lease{{{First: 2, Count: 2}}}
	if bad.Validate() == nil {
		t.Error("a lease of chunks 2-3 of 3 handed out validated")
	}
	bad = p
	bad.Hold = 2
	if bad.Validate() == nil {
		t.Error("a queue with a hold validated")
	}
	q := p.Lease(0, 1).Lease(1, 2)
	if len(p.Leases[0]) != 0 || len(p.Leases[1]) != 1 || q.Leases[0][0] != (Lease{3, 1}) || len(q.Leases[1]) != 2 || q.Leases[1][1] != (Lease{4, 2}) {
		t.Errorf("Lease changed the plan it was given, or handed the wrong chunks: %v -> %v", p.Leases, q.Leases)
	}
	if r := q.Lease(1, 1); len(r.Leases[1]) != 2 || r.Leases[1][1] != (Lease{4, 3}) || r.LeasedChunks(1) != 6 {
		t.Errorf("a lease following the worker's last did not extend it: %v", r.Leases)
	}
	for pos, want := range map[int64]int64{0: 0, 3*int64(p.Chunk) - 1: 2, 3 * int64(p.Chunk): 4, 5 * int64(p.Chunk): 6, 6 * int64(p.Chunk): -1} {
		_, _, b, ok := q.Lease(1, 1).Locate(1, pos)
		if chunk := b / int64(p.Chunk); !ok && want >= 0 || ok && chunk != want {
			t.Errorf("worker 1's position %d is in chunk %d (%v), want %d", pos, chunk, ok, want)
		}
	}
}
