package chief_test

import (
	"context"
	"testing"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/testcluster"
)

// idSamples is n samples whose single value is the sample's index.
func idSamples(n int) *dataset.Dataset {
	ds := &dataset.Dataset{Images: make([]float32, n), Labels: make([]uint8, n), N: n, Dim: 1, Classes: 1}
	for i := range ds.Images {
		ds.Images[i] = float32(i)
	}
	return ds
}

// TestElasticWorkers scales a sync run 2 -> 3 -> 1 workers while it
// trains (docs/elastic.md) and checks, from the data positions the
// shards hold at the end, that the model holds every sample of every
// completed epoch exactly once: each worker's batches are read back
// through the run's data plan over a data set of sample indices.
func TestElasticWorkers(t *testing.T) {
	run := tinyRun(config.Sync, 30)
	run.MaxWorkers = 3
	run.HeartbeatTimeout = 2 * time.Second
	c, _ := startRun(t, run, testcluster.WorkerOptions{})
	ch := c.Chief().Chief()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := testcluster.WaitFor(ctx, "training", func() bool { s, _ := c.Worker(0).Progress(); return s >= 3 }); err != nil {
		t.Fatal(err)
	}
	if err := ch.Scale(3); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartWorker(2, testcluster.WorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := testcluster.WaitFor(ctx, "3 workers", func() bool { return ch.DataPlan().Last().Workers == 3 }); err != nil {
		t.Fatal(err)
	}
	if err := ch.Scale(1); err != nil {
		t.Fatal(err)
	}
	if err := ch.Scale(9); err == nil {
		t.Error("scaled past --max-workers")
	}
	rep, err := c.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plan := ch.DataPlan()
	got := rep.MembershipChanges
	if len(got) != 2 || got[0].From != 2 || got[0].To != 3 || got[1].To != 1 || len(plan.Eras) != 3 {
		t.Fatalf("changes %+v, plan %+v; want 2 -> 3 -> 1", got, plan)
	}
	if rep.StoppedBy != "epochs" || rep.EpochsDone < 29.99 || rep.EpochsDone > 30.1 {
		t.Errorf("stopped by %s after %.3f epochs, want epochs after 30", rep.StoppedBy, rep.EpochsDone)
	}
	// Each worker's position: the furthest any shard holds.
	pos := make([]int64, 3)
	for s := range run.PS {
		for w := range pos {
			cl, err := c.PS(s).ClientAs(w)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := cl.Pull(ctx, &pb.PullRequest{RunId: c.Worker(0).Registration().RunId, Worker: int32(w)})
			if err != nil {
				t.Fatal(err)
			}
			pos[w] = max(pos[w], resp.DataPosition)
		}
	}
	ids := idSamples(plan.N)
	seen := map[int64]map[int]int{} // epoch -> sample -> times in the model
	x, y := make([]float32, run.Batch), make([]uint8, run.Batch)
	for w, p := range pos {
		b, err := dataset.NewElasticBatches(w, run.Seed, plan, func(i, n int) (dataset.Samples, error) { return ids.Shard(i, n), nil })
		if err != nil {
			t.Fatal(err)
		}
		for q := range p {
			_, epoch, _, err := b.Where(q)
			if err != nil {
				t.Fatalf("worker/%d position %d: %v", w, q, err)
			}
			b.SeekBatch(q)
			b.Next(x, y)
			if seen[epoch] == nil {
				seen[epoch] = map[int]int{}
			}
			for _, v := range x {
				seen[epoch][int(v)]++
			}
		}
	}
	last := plan.Last()
	lastEpoch := last.Epoch + (rep.FinalStep-last.Step)/plan.PerEpoch(len(plan.Eras)-1) // the first not completed
	for e := int64(0); e < lastEpoch; e++ {
		k := len(plan.Eras) - 1
		for plan.Eras[k].Epoch > e {
			k--
		}
		want := plan.Eras[k].Workers * int(plan.PerEpoch(k)) * run.Batch
		n := 0
		for id, times := range seen[e] {
			if times != 1 {
				t.Errorf("epoch %d: sample %d is in the model %d times", e, id, times)
			}
			n += times
		}
		if n != want {
			t.Errorf("epoch %d (era %d, %d workers): %d samples in the model, want %d", e, k, plan.Eras[k].Workers, n, want)
		}
	}
	for e, s := range seen {
		for id, times := range s {
			if e >= lastEpoch && times != 1 {
				t.Errorf("epoch %d (partial): sample %d is in the model %d times", e, id, times)
			}
		}
	}
	t.Logf("changes %+v, plan %+v, positions %v", got, plan.Eras, pos)
}

// A worker removed and then added back trains again: the shards hold its
// pulls until the change is released instead of answering "done" (which
// ended the new process at once while the run waited for it).
func TestElasticWorkerAddedBack(t *testing.T) {
	run := tinyRun(config.Sync, 60)
	run.MaxWorkers = 2
	run.HeartbeatTimeout = 2 * time.Second
	c, _ := startRun(t, run, testcluster.WorkerOptions{})
	ch := c.Chief().Chief()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := testcluster.WaitFor(ctx, "training", func() bool { s, _ := c.Worker(0).Progress(); return s >= 3 }); err != nil {
		t.Fatal(err)
	}
	if err := ch.Scale(1); err != nil {
		t.Fatal(err)
	}
	if err := c.Worker(1).Wait(ctx); err != nil {
		t.Fatalf("removed worker 1: %v", err)
	}
	if err := ch.Scale(2); err != nil {
		t.Fatal(err)
	}
	w, err := c.StartWorker(1, testcluster.WorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ended := func() bool {
		select {
		case <-w.Done():
			return true
		default:
			return false
		}
	}
	if err := testcluster.WaitFor(ctx, "the re-added worker to train", func() bool { s, _ := w.Progress(); return s >= 3 || ended() }); err != nil {
		t.Fatal(err)
	}
	if s, _ := w.Progress(); s < 3 {
		s0, _ := c.Worker(0).Progress()
		t.Fatalf("re-added worker 1 ended after %d steps (err %v) while worker 0 is at step %d; plan %+v", s, w.Err(), s0, ch.DataPlan().Eras)
	}
	rep, err := c.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.MembershipChanges) != 2 || rep.MembershipChanges[1].To != 2 {
		t.Errorf("membership changes %+v, want 2 -> 1 -> 2", rep.MembershipChanges)
	}
}
