package dataset

import (
	"errors"
	"testing"
	"time"
)

// asyncWorker is one worker of TestElasticBatchesAsyncExactlyOnce.
type asyncWorker struct {
	src   *ElasticBatches
	speed int // batches a tick
}

// canRead mirrors Next's wait: the plan gives w a batch at pos.
func canRead(p DataPlan, w int, pos int64) (epoch int64, ok bool) {
	k, e, _, ok := p.Locate(w, pos)
	return e, ok && (p.Hold == 0 || k < len(p.Eras)-1 || e < p.Hold)
}

// TestElasticBatchesAsyncExactlyOnce runs workers of different speeds
// (no lockstep) through 2 -> 4 -> 1 workers under the async protocol
// (docs/elastic.md): a hold past the epoch each worker reads, handed to
// the workers a tick late (some refuse it: the hold moves), the new era
// published once every member took it, a removed worker retired once it
// waits past its last batch. Every epoch each member read in full holds
// each sample of the set at most once and W*PerEpoch*B of them.
func TestElasticBatchesAsyncExactlyOnce(t *testing.T) {
	const n, batch = 203, 4
	ds := idSet(n)
	load := func(i, c int) (Samples, error) { return ds.Shard(i, c), nil }
	plan := NewDataPlan(n, batch, 2)
	ws := map[int]*asyncWorker{}
	join := func(w, speed int) {
		src, err := NewElasticBatches(w, 3, plan, load)
		if err != nil {
			t.Fatal(err)
		}
		ws[w] = &asyncWorker{src: src, speed: speed}
	}
	join(0, 3)
	join(1, 1)
	seen := map[int64]map[int]bool{}
	x, y := make([]float32, batch), make([]uint8, batch)
	targets := map[int]int{4: 4, 40: 1} // tick -> workers asked for
	var hold int64
	target, refusals := 0, 0
	for tick := 0; tick < 400; tick++ {
		if w, ok := targets[tick]; ok {
			target = w
			hold = plan.Last().Epoch + 1 // the next epoch, as if no worker had said where it reads
		}
		if target != 0 {
			// The chief's tick: heartbeats of the last tick say where each reads.
			taken := true
			for w, aw := range ws {
				if _, ok := plan.StartOf(w, hold); !ok {
					continue
				}
				if plan.NextEpoch(w, aw.src.Position()) > hold {
					hold = plan.NextEpoch(w, aw.src.Position())
					refusals++
				}
				if aw.src.Hold() != hold {
					taken = false
					p := plan
					p.Hold = hold
					if err := aw.src.SetPlan(p); err != nil && !errors.Is(err, ErrPastHold) {
						t.Fatal(err)
					}
				}
			}
			if taken {
				plan = plan.Scale(int64(tick), hold, target)
				for w := range target {
					if ws[w] == nil {
						join(w, 2)
					}
				}
				target = 0
			}
		}
		for w, aw := range ws {
			if target == 0 && aw.src.Hold() != 0 || aw.src.Eras() != len(plan.Eras) {
				if err := aw.src.SetPlan(plan); err != nil {
					t.Fatal(err)
				}
			}
			for range aw.speed {
				epoch, ok := canRead(aw.src.Plan(), w, aw.src.Position())
				if !ok {
					if end, removed := plan.Ends(w); removed && aw.src.Position() >= end {
						delete(ws, w) // retired
					}
					break
				}
				aw.src.Next(x, y)
				if seen[epoch] == nil {
					seen[epoch] = map[int]bool{}
				}
				for _, v := range x {
					if seen[epoch][int(v)] {
						t.Fatalf("epoch %d: sample %d read twice (worker %d, tick %d)", epoch, int(v), w, tick)
					}
					seen[epoch][int(v)] = true
				}
			}
		}
	}
	if len(plan.Eras) != 3 || refusals == 0 || len(ws) != 1 {
		t.Fatalf("plan %+v, %d refusals, workers left %d; want 3 eras, a hold moved, one worker", plan.Eras, refusals, len(ws))
	}
	// Every epoch up to the slowest member's read in full.
	for e := int64(0); e < plan.Eras[2].Epoch+2; e++ {
		k := 0
		for k+1 < len(plan.Eras) && plan.Eras[k+1].Epoch <= e {
			k++
		}
		if want := plan.Eras[k].Workers * int(plan.PerEpoch(k)) * batch; len(seen[e]) != want {
			t.Errorf("epoch %d (era %d): %d samples read, want %d", e, k, len(seen[e]), want)
		}
	}
}

// TestElasticBatchesWait: Next waits at a hold and past the last era
// until a plan gives it a batch, or Close.
func TestElasticBatchesWait(t *testing.T) {
	const n, batch = 40, 5 // two workers: 4 batches an epoch
	load := func(i, c int) (Samples, error) { return idSet(n).Shard(i, c), nil }
	p := NewDataPlan(n, batch, 2)
	b, err := NewElasticBatches(1, 0, p, load)
	if err != nil {
		t.Fatal(err)
	}
	b.SeekBatch(5)
	held := p
	held.Hold = 1
	if err := b.SetPlan(held); !errors.Is(err, ErrPastHold) {
		t.Fatalf("hold at epoch 1 with position 5: %v, want ErrPastHold", err)
	}
	held.Hold = 2
	if err := b.SetPlan(held); err != nil {
		t.Fatal(err)
	}
	x, y := make([]float32, batch), make([]uint8, batch)
	for range 3 {
		b.Next(x, y)
	}
	read := make(chan struct{})
	go func() { b.Next(x, y); close(read) }()
	waitFor(t, b.Waiting)
	// The new era from epoch 2: one worker; worker 1 was removed and
	// has read its last batch.
	if err := b.SetPlan(p.Scale(8, 2, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b.Waiting)
	if b.Position() != 8 || b.Ended() {
		t.Fatalf("position %d, ended %t; want waiting at 8", b.Position(), b.Ended())
	}
	b.Close()
	<-read
	if !b.Ended() || b.Position() != 8 {
		t.Fatalf("after Close: ended %t at %d", b.Ended(), b.Position())
	}
}

// waitFor waits until cond holds (a goroutine gets there).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDataPlanStartOfNextEpochEnds(t *testing.T) {
	p := NewDataPlan(60, 5, 2).Scale(12, 2, 3) // 6 batches an epoch, then 4
	if s, ok := p.StartOf(1, 3); !ok || s != 16 {
		t.Errorf("StartOf(1, 3) = %d, %t; want 16", s, ok)
	}
	if _, ok := p.StartOf(1, 1); ok {
		t.Error("StartOf before the last era's first epoch")
	}
	for _, c := range []struct {
		w        int
		pos, got int64
	}{{0, 10, 2}, {0, 12, 2}, {0, 13, 3}, {2, 0, 2}, {2, 4, 3}, {2, 5, 4}} {
		if e := p.NextEpoch(c.w, c.pos); e != c.got {
			t.Errorf("NextEpoch(%d, %d) = %d, want %d", c.w, c.pos, e, c.got)
		}
	}
	q := p.Scale(20, 4, 1)
	if end, ok := q.Ends(2); !ok || end != 8 {
		t.Errorf("Ends(2) = %d, %t; want 8", end, ok)
	}
	if _, ok := q.Ends(0); ok {
		t.Error("Ends of a member")
	}
}
