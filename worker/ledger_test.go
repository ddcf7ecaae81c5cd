package worker_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/wire"
	"github.com/pstrain/pstrain/worker"
)

// The shards' gaps (ps.Shard.Gaps), which the chief's data ledger
// counts as skipped (chief/core_ledger.go, docs/recovery.md), are
// exactly the batches a shard's slice of the final model misses while
// another shard's holds them:
//
//   - async and ssp, ps/1 restored alone from a checkpoint while ps/0
//     goes on (the test is the chief: it snapshots both shards with the
//     workers paused and later re-initialises ps/1 from that checkpoint
//     in a new generation). ps/1 misses each worker's batches from the
//     checkpoint's position to where the worker went on, the batch whose
//     gradient was under way at the restore included;
//   - sync with a backup worker (3 workers, 2 gradients a step): a
//     gradient one shard counted and another dropped as stale.
func TestShardGapsAreTheBatchesItMisses(t *testing.T) {
	for _, mode := range []config.Mode{config.Async, config.SSP} {
		t.Run(string(mode)+"-restore", func(t *testing.T) {
			h := newPosHarness(t, mode, 2, 0, true)
			mark := restoreOneMidway(t, h)
			waitAll(t, h.c)
			n := h.checkGaps(func(p pushRec, i int) bool { return !(p.shard == 1 && p.gen == 1 && i >= mark) })
			if n[1] == 0 {
				t.Error("ps/1 misses no batch: the test restored nothing")
			}
		})
	}
	t.Run("sync-backup", func(t *testing.T) {
		h := newPosHarness(t, config.Sync, 3, 2, false)
		for w := range 3 {
			h.start(w, nil)
		}
		waitAll(t, h.c)
		_, versions := params(t, h.c)
		h.checkGaps(func(p pushRec, _ int) bool { return p.version < versions[p.shard] })
	})
}

// restoreOneMidway runs two workers, snapshots both shards with them
// paused at their step 6, restores ps/1 alone from it at their step 12,
// and returns the number of pushes the snapshot holds.
func restoreOneMidway(t *testing.T, h *posHarness) int {
	const at, until = 6, 12
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	paused := make(chan chan struct{})
	for w := range 2 {
		h.start(w, func(cfg *worker.Config, _ func()) {
			cfg.BeforePush = func(step int64) {
				if step == at || step == until {
					resume := make(chan struct{})
					paused <- resume
					<-resume
				}
			}
		})
	}
	both := func(then func()) {
		t.Helper()
		var rs []chan struct{}
		for range 2 {
			select {
			case r := <-paused:
				rs = append(rs, r)
			case <-ctx.Done():
				t.Fatal("the workers did not pause")
			}
		}
		then()
		for _, r := range rs {
			close(r)
		}
	}
	var mark int
	var v int64
	both(func() {
		v = h.status(ctx, 0).Version
		h.l.mu.Lock()
		mark = len(h.l.pushes)
		h.l.mu.Unlock()
		h.commitAsync(v, h.snapshotAll(ctx, v))
	})
	both(func() { h.restoreOne(ctx, 1, 2, v) })
	return mark
}

// checkGaps checks, for every shard and worker, that the batches the
// shard's gaps name are those it misses of the ones any shard holds
// (held says a push's gradient is in the final model, i the push's
// index in the ledger), and returns the batches missed by shard. A gap
// is a jump of the shard's position: batches past its final position
// (the run ended before it counted a later one) are none; those the
// test leaves out.
func (h *posHarness) checkGaps(held func(p pushRec, i int) bool) []int {
	t := h.t
	t.Helper()
	ctx := context.Background()
	final := h.finalPositions()
	gaps := make([]map[int][]int64, h.run.PS) // [shard][worker] batches
	for s := range gaps {
		gaps[s] = map[int][]int64{}
		g := h.status(ctx, s).DataGaps
		for i := 0; i+2 < len(g); i += 3 {
			for q := g[i+1]; q < g[i+2]; q++ {
				gaps[s][int(g[i])] = append(gaps[s][int(g[i])], q)
			}
		}
	}
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	in := make([]map[int][]int64, h.run.PS)
	for s := range in {
		in[s] = map[int][]int64{}
	}
	for i, p := range h.l.pushes {
		if p.err == nil && p.outcome == pb.PushResponse_APPLIED && held(p, i) {
			in[p.shard][p.worker] = append(in[p.shard][p.worker], h.l.batches[p.tag].pos)
		}
	}
	missed := make([]int, h.run.PS)
	for w := range h.run.Workers {
		var union []int64
		for s := range in {
			union = append(union, in[s][w]...)
		}
		union = slices.Compact(slices.Sorted(slices.Values(union)))
		for s := range in {
			var miss []int64
			for _, q := range union {
				if q < final[s][w] && !slices.Contains(in[s][w], q) {
					miss = append(miss, q)
				}
			}
			got := slices.Sorted(slices.Values(gaps[s][w]))
			if !slices.Equal(miss, got) {
				t.Errorf("ps/%d, worker %d: misses batches %v, its gaps say %v", s, w, miss, got)
			}
			missed[s] += len(miss)
		}
	}
	t.Logf("batches missed by shard: %v", missed)
	return missed
}

// status is shard s's Status.
func (h *posHarness) status(ctx context.Context, s int) *pb.StatusResponse {
	h.t.Helper()
	st, err := h.c.PS(s).Client().Status(ctx, &pb.StatusRequest{})
	if err != nil {
		h.t.Fatal(err)
	}
	return st
}

// commitAsync commits the manifest of the shards' checkpoints cks at
// version at with every worker's furthest data position, as the chief
// does, and returns those positions.
func (h *posHarness) commitAsync(at int64, cks []*pb.CheckpointResponse) []int64 {
	t := h.t
	t.Helper()
	var positions []int64
	var infos []checkpoint.ShardInfo
	for s, ck := range cks {
		infos = append(infos, checkpoint.ShardInfo{Index: s, File: ck.File, SHA256: ck.Sha256, Bytes: ck.Bytes, Tensors: ck.Tensors, Version: ck.Version})
		for w, p := range ck.DataPositions {
			if w >= len(positions) {
				positions = append(positions, 0)
			}
			positions[w] = max(positions[w], p)
		}
	}
	if err := h.c.Checkpoints().Commit(checkpoint.Manifest{Step: at, Version: at, Mode: string(h.run.Mode), ModelSpec: posSpec.JSON(),
		Shards: infos, DataPositions: positions}); err != nil {
		t.Fatal(err)
	}
	return positions
}

// restoreOne re-initialises shard s alone in generation gen from the
// checkpoint of step at, as the chief does when an async or ssp PS
// comes back empty.
func (h *posHarness) restoreOne(ctx context.Context, s int, gen, at int64) {
	t := h.t
	t.Helper()
	store := h.c.Checkpoints()
	loaded, err := store.Load(store.Path(at))
	if err != nil {
		t.Fatal(err)
	}
	st, err := shardckpt.Read(loaded, posSpec, h.run.Optimizer)
	if err != nil {
		t.Fatal(err)
	}
	p, o := st.Shard(h.c.Plan(), s)
	req := &pb.InitRequest{RunId: "test", Shard: int32(s), NumShards: int32(h.run.PS), ShardOptions: ps.OptionsFor(h.run).Proto(),
		ModelSpec: convert.ModelSpec(posSpec), Params: wire.Bytes(p), OptimizerState: wire.Bytes(o), Version: loaded.Manifest.Version,
		MaxVersion: h.maxVersion, LiveWorkers: []int32{0, 1}, Generation: gen, OptimizerStep: st.OptimizerSteps,
		DataPositions: loaded.Manifest.DataPositions, StepsPerEpoch: float64(posPerEpoch)}
	if _, err := h.c.PS(s).Client().Init(ctx, req); err != nil {
		t.Fatal(err)
	}
}
