package worker_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/transport/wire"
	"github.com/pstrain/pstrain/worker"
)

// The tests here prove that every sample of a worker's data shard is used
// exactly once per epoch through faults: the multiset of samples whose
// gradients the final model holds has each sample of every completed
// epoch exactly once. A ledger records which samples each batch a worker
// took held (its source reads the real dataset.FullBatches) and what each
// shard did with each gradient (its client tags every push with the
// batch); a gradient is in the final model if a shard counted it in a
// timeline that survived (not rolled back) and in a step that completed.

const (
	posBatch    = 4
	posPerShard = 24 // samples per worker: 6 full batches per epoch, none left over
	posPerEpoch = posPerShard / posBatch
	posSteps    = 30 // batches per worker: 5 epochs
)

var posSpec = model.Spec{Input: 8, Hidden: []int{6}, Classes: 3}

type batchRec struct {
	worker, inc int // worker index and incarnation
	pos         int64
	ids         []int // sample ids, in batch order
}

type pushRec struct {
	shard, tag, worker int
	gen, version       int64
	outcome            pb.PushResponse_Outcome
	err                error // the outcome is unknown
}

// ledger is what the tests saw; safe for concurrent use.
type ledger struct {
	mu      sync.Mutex
	batches []batchRec // by tag
	pushes  []pushRec
	errs    []string // pushes of a position other than their batch's
}

func (l *ledger) batch(b batchRec) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, b)
	return len(l.batches) - 1
}

// tag is the batch a push of src's worker with data position after
// carries the gradient of: the batch the source took last, or the one
// before it if the last is the next step's, loaded ahead while the push
// was under way (worker/head_start.go). Either must be at after-1; if not,
// the worker reported another position than the one it trained on,
// which is recorded as an error (and the last batch is the tag).
func (l *ledger) tag(src *recordingSource, after int64) int {
	last, prev := src.taken()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case last >= 0 && l.batches[last].pos == after-1:
		return last
	case last >= 0 && prev >= 0 && l.batches[last].pos == after && l.batches[prev].pos == after-1:
		return prev
	}
	l.errs = append(l.errs, fmt.Sprintf("worker %d (incarnation %d) pushed data position %d after taking batches %d and %d", src.worker, src.inc, after, l.pos(prev), l.pos(last)))
	return last
}

// pos is the position of the batch tagged t, -1 for none.
func (l *ledger) pos(t int) int64 {
	if t < 0 {
		return -1
	}
	return l.batches[t].pos
}

func (l *ledger) push(p pushRec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pushes = append(l.pushes, p)
}

// recordingSource is the worker task's batch source (dataset.FullBatches
// of its data shard) recording the sample ids of each batch taken.
type recordingSource struct {
	fb          *dataset.FullBatches
	l           *ledger
	ids         map[string]int // a sample's image bytes -> its id
	dim         int
	worker, inc int
	mu          sync.Mutex
	last, prev  int // the tags of the batches taken last and before it (-1: none)
}

// taken is the tags of the batches taken last and before it.
func (s *recordingSource) taken() (last, prev int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, s.prev
}

func (s *recordingSource) Next(x []float32, y []uint8) {
	pos := s.fb.Position()
	s.fb.Next(x, y)
	b := batchRec{worker: s.worker, inc: s.inc, pos: pos}
	for r := range y {
		id, ok := s.ids[string(wire.Bytes(x[r*s.dim:(r+1)*s.dim]))]
		if !ok {
			panic("a batch holds a sample that is not in the data set")
		}
		b.ids = append(b.ids, id)
	}
	t := s.l.batch(b)
	s.mu.Lock()
	s.last, s.prev = t, s.last
	s.mu.Unlock()
}

func (s *recordingSource) SeekBatch(p int64) { s.fb.SeekBatch(p) }

// taggingPlane records what the shard did with each push, tagged with the
// batch the gradient came from.
type taggingPlane struct {
	worker.DataPlane
	src   *recordingSource
	l     *ledger
	shard int
}

func (p *taggingPlane) Push(ctx context.Context, in *pb.PushRequest, opts ...grpc.CallOption) (*pb.PushResponse, error) {
	if err := ctx.Err(); err != nil {
		// A killed worker's push: gRPC sends nothing for a context that
		// has ended (a push in flight when it ends would be unknown).
		return nil, status.FromContextError(err).Err()
	}
	resp, err := p.DataPlane.Push(ctx, in, opts...)
	r := pushRec{shard: p.shard, tag: p.l.tag(p.src, in.DataPosition), worker: int(in.Worker), gen: in.Generation, version: in.Version, err: err}
	if err == nil {
		r.outcome = resp.Outcome
	}
	p.l.push(r)
	return resp, err
}

// posHarness is a cluster of 2 shards and a few workers on a tiny
// synthetic data set, with the test in the chief's place.
type posHarness struct {
	t    *testing.T
	c    *testcluster.Cluster
	run  config.Run
	data *dataset.Dataset
	ids  map[string]int
	l    *ledger
	incs atomic.Int32
	// maxVersion is where training ends.
	maxVersion int64
}

// newPosHarness starts the cluster: workers workers, replicas of them
// per sync step (0: all), checkpoints in memory if asked.
func newPosHarness(t *testing.T, mode config.Mode, workers, replicas int, checkpoints bool) *posHarness {
	t.Helper()
	run := config.Default()
	run.LRSchedule = "constant" // the update rule under test, not the schedule
	run.Mode, run.PS, run.Workers, run.Batch, run.Hidden = mode, 2, workers, posBatch, posSpec.Hidden
	run.ReplicasToAggregate = replicas
	run.LR, run.Optimizer, run.DataPlane, run.Staleness = mechanismLR, "momentum", config.GRPC, 2
	if checkpoints {
		run.CheckpointDir = "/ck"
	}
	h := &posHarness{t: t, run: run, data: testcluster.Synthetic(workers*posPerShard, posSpec.Input, posSpec.Classes, 11),
		ids: map[string]int{}, l: &ledger{}}
	// About posSteps batches per worker: a sync step takes R gradients,
	// an async/ssp update one.
	h.maxVersion = int64(workers * posSteps)
	if mode == config.Sync {
		h.maxVersion /= int64(run.Replicas())
	}
	for i := range h.data.N {
		h.ids[string(wire.Bytes(h.data.Image(i)))] = i
	}
	if len(h.ids) != h.data.N {
		t.Fatal("two samples with the same image: ids would be ambiguous")
	}
	h.c = startCluster(t, run, posSpec, h.maxVersion)
	// As the chief does: the first state is generation 1, so that a
	// gradient of a rolled-back timeline can never pass for "any".
	init := posSpec.Init(uint64(run.Seed))
	plan := h.c.Plan()
	var shards []shardState
	for s := range run.PS {
		flat := make([]float32, plan.Shards[s].Size)
		plan.Gather(s, init, flat)
		shards = append(shards, shardState{params: flat})
	}
	h.initAll(1, shards, nil)
	return h
}

type shardState struct {
	params, opt []float32
	optSteps    int64
	version     int64
}

// initAll initialises every shard in generation gen, as the chief does on
// a start or a sync restore (chief/recovery.go, initShard).
func (h *posHarness) initAll(gen int64, shards []shardState, positions []int64) {
	h.t.Helper()
	var live []int32
	for w := range h.run.Workers {
		live = append(live, int32(w))
	}
	for s, st := range shards {
		req := &pb.InitRequest{RunId: "test", Shard: int32(s), NumShards: int32(h.run.PS), ShardOptions: ps.OptionsFor(h.run).Proto(),
			ModelSpec: convert.ModelSpec(posSpec), Params: wire.Bytes(st.params), Version: st.version, MaxVersion: h.maxVersion,
			LiveWorkers: live, Generation: gen, OptimizerStep: st.optSteps, DataPositions: positions,
			StepsPerEpoch: float64(posPerEpoch)}
		if len(st.opt) > 0 {
			req.OptimizerState = wire.Bytes(st.opt)
		}
		if _, err := h.c.PS(s).Client().Init(context.Background(), req); err != nil {
			h.t.Fatal(err)
		}
	}
}

// start starts an incarnation of worker index; tweak (if not nil) sets
// its hooks and may kill it with the cancel function it is given.
func (h *posHarness) start(index int, tweak func(cfg *worker.Config, kill func())) *testcluster.Worker {
	h.t.Helper()
	ctx, kill := context.WithCancel(context.Background())
	h.t.Cleanup(kill)
	inc := int(h.incs.Add(1))
	var src *recordingSource
	w, err := h.c.StartWorker(index, testcluster.WorkerOptions{Context: ctx,
		Batches: func(shard, n int) worker.BatchSource {
			// As task.RunWorker reads its data shard.
			b := dataset.NewBatcher(h.data.Shard(shard, n), h.run.Batch, h.run.Seed+int64(shard))
			src = &recordingSource{fb: dataset.NewFullBatches(b), l: h.l, ids: h.ids, dim: h.data.Dim, worker: index, inc: inc, last: -1, prev: -1}
			return src
		},
		Tweak: func(cfg *worker.Config) {
			for s := range cfg.Shards {
				cfg.Shards[s].Client = &taggingPlane{DataPlane: cfg.Shards[s].Client, src: src, l: h.l, shard: s}
			}
			if tweak != nil {
				tweak(cfg, kill)
			}
		}})
	if err != nil {
		h.t.Fatal(err)
	}
	return w
}

func (h *posHarness) waitDone(w *testcluster.Worker) {
	h.t.Helper()
	select {
	case <-w.Done():
	case <-time.After(30 * time.Second):
		h.t.Fatalf("worker/%d did not stop", w.Index())
	}
}

// check verifies exactly-once use against the final state. survives says
// whether a gradient counted in generation gen for version v is in the
// final model, given each shard's final version.
func (h *posHarness) check(survives func(gen, v int64, final int64) bool) {
	t := h.t
	t.Helper()
	waitAll(t, h.c)
	_, versions := params(t, h.c)
	final := h.finalPositions()
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	for _, e := range h.l.errs {
		t.Error(e)
	}
	held := h.held(survives, versions)
	most := int64(0) // the most epochs a worker completed
	for w := range h.run.Workers {
		top := h.checkHeld(w, held, final)
		epochs := h.checkEpochs(w, top)
		most = max(most, epochs)
		t.Logf("worker %d: %d batches (%d whole epochs) in the model, each sample once per epoch", w, top, epochs)
	}
	if most < 2 {
		t.Fatalf("no worker completed 2 epochs (%d): the test needs epoch boundaries", most)
	}
}

// finalPositions are the shards' final data positions, [shard][worker].
func (h *posHarness) finalPositions() [][]int64 {
	t := h.t
	t.Helper()
	final := make([][]int64, h.run.PS)
	for s := range final {
		for w := range h.run.Workers {
			resp, err := pullAs(t, h.c.PS(s), w)
			if err != nil {
				t.Fatal(err)
			}
			final[s] = append(final[s], resp.DataPosition)
		}
	}
	return final
}

// held is the positions of the batches whose gradients the final model
// holds, [shard][worker], given the shards' final versions. Call with
// h.l.mu held.
func (h *posHarness) held(survives func(gen, v int64, final int64) bool, versions []int64) [][][]int64 {
	t := h.t
	t.Helper()
	held := make([][][]int64, h.run.PS)
	for s := range held {
		held[s] = make([][]int64, h.run.Workers)
	}
	for _, p := range h.l.pushes {
		if p.err != nil {
			t.Fatalf("a push failed, its outcome is unknown: %v", p.err)
		}
		b := h.l.batches[p.tag]
		if b.worker != p.worker {
			t.Fatalf("push of worker %d tagged with worker %d's batch", p.worker, b.worker)
		}
		if p.outcome == pb.PushResponse_APPLIED && survives(p.gen, p.version, versions[p.shard]) {
			held[p.shard][p.worker] = append(held[p.shard][p.worker], b.pos)
		}
	}
	return held
}

// checkHeld checks worker w's batches in the model against its data
// positions (final, [shard][worker]): no shard holds one twice, each
// shard's position is one past the furthest it holds, and together they
// hold batches 0..top-1, top being the furthest position. It returns top.
// Call with h.l.mu held.
func (h *posHarness) checkHeld(w int, held [][][]int64, final [][]int64) int64 {
	t := h.t
	t.Helper()
	var union []int64
	var top int64
	for s := range held {
		ps := slices.Sorted(slices.Values(held[s][w]))
		if len(slices.Compact(slices.Clone(ps))) != len(ps) {
			t.Fatalf("ps/%d holds a batch of worker %d twice: positions %v", s, w, ps)
		}
		// A shard's position is one past the furthest batch it holds
		// (with backup workers it may have dropped some others hold).
		if n := len(ps); n > 0 && ps[n-1]+1 != final[s][w] {
			t.Fatalf("ps/%d holds worker %d's batches up to %d, its data position says %d", s, w, ps[n-1], final[s][w])
		}
		union = append(union, ps...)
		top = max(top, final[s][w])
	}
	union = slices.Compact(slices.Sorted(slices.Values(union)))
	for i, p := range union {
		if p != int64(i) {
			t.Fatalf("worker %d: the model holds batches %v, want 0..%d", w, union, top-1)
		}
	}
	if int64(len(union)) != top {
		t.Fatalf("worker %d: the model holds %d batches, its data position is %d", w, len(union), top)
	}
	return top
}

// checkEpochs checks that worker w's batches 0..top-1 use each sample of
// its data shard once per epoch (the last epoch, if incomplete, at most
// once) and returns the number of whole epochs. Call with h.l.mu held.
func (h *posHarness) checkEpochs(w int, top int64) int64 {
	t := h.t
	t.Helper()
	// The samples of each position (the same whenever it was taken).
	ids := map[int64][]int{}
	for _, b := range h.l.batches {
		if b.worker != w {
			continue
		}
		if prev, ok := ids[b.pos]; ok && !slices.Equal(prev, b.ids) {
			t.Fatalf("worker %d's batch %d held %v once and %v another time", w, b.pos, prev, b.ids)
		}
		ids[b.pos] = b.ids
	}
	lo, hi := w*posPerShard, (w+1)*posPerShard // the worker's data shard
	epochs := top / posPerEpoch
	for e := range epochs + 1 {
		var got []int
		for p := e * posPerEpoch; p < min((e+1)*posPerEpoch, top); p++ {
			got = append(got, ids[p]...)
		}
		slices.Sort(got)
		if len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Fatalf("worker %d, epoch %d: a sample used twice: %v", w, e, got)
		}
		for _, id := range got {
			if id < lo || id >= hi {
				t.Fatalf("worker %d used sample %d, not of its shard", w, id)
			}
		}
		if e < epochs && len(got) != posPerShard {
			t.Fatalf("worker %d, epoch %d: %d samples used, want each of %d once", w, e, len(got), posPerShard)
		}
	}
	return epochs
}

// firstPos is the position of the first batch incarnation inc took.
func (h *posHarness) firstPos(inc int) int64 {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	for _, b := range h.l.batches {
		if b.inc == inc {
			return b.pos
		}
	}
	return -1
}

// (a) A killed worker's replacement resumes its data shard where the
// model's gradients of it stop: worker 1 dies after taking a batch it
// never pushes, worker 0 after its pull. In sync and in ssp mode (where a
// dead worker's clock holds the other back until its replacement runs,
// so both workers train through several epochs; in async the other
// worker could finish the run alone first).
func TestKilledWorkerResumesItsData(t *testing.T) {
	for _, mode := range []config.Mode{config.Sync, config.SSP} {
		t.Run(string(mode), func(t *testing.T) {
			h := newPosHarness(t, mode, 2, 0, false)
			w1 := h.start(1, func(cfg *worker.Config, kill func()) {
				cfg.BeforePush = func(step int64) {
					if step == 8 {
						kill()
					}
				}
			})
			w0 := h.start(0, func(cfg *worker.Config, kill func()) {
				cfg.AfterPull = func(step int64) {
					if step == 15 {
						kill()
					}
				}
			})
			h.waitDone(w1)
			h.start(1, nil) // incarnation 3
			h.waitDone(w0)
			h.start(0, nil) // incarnation 4
			h.check(func(gen, v, final int64) bool { return gen == 1 && v < final })
			for _, inc := range []int{3, 4} {
				if p := h.firstPos(inc); p <= 0 {
					t.Errorf("incarnation %d started at batch %d: the restart did not resume", inc, p)
				}
			}
		})
	}
}

// (b) A sync rollback: a checkpoint at version 8 (taken while worker 1's
// gradient for step 8 waits in the step), training goes on to version 14,
// then every shard is re-initialised from the checkpoint in a new
// generation, as the chief does when a PS restarts. The workers go back
// to their positions in the checkpoint; nothing of the abandoned timeline
// stays in the model.
func TestRollbackRewindsTheData(t *testing.T) {
	const at, until = 8, 14
	h := newPosHarness(t, config.Sync, 2, 0, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Worker 0 stops before its pushes at steps 8 and 14 until the test,
	// in the chief's place, has done its part.
	pause := map[int64]chan chan struct{}{at: make(chan chan struct{}), until: make(chan chan struct{})}
	h.start(0, func(cfg *worker.Config, _ func()) {
		cfg.BeforePush = func(step int64) {
			if ch, ok := pause[step]; ok {
				resume := make(chan struct{})
				ch <- resume
				<-resume
			}
		}
	})
	h.start(1, nil)
	waitPause := func(step int64) chan struct{} {
		t.Helper()
		select {
		case resume := <-pause[step]:
			return resume
		case <-ctx.Done():
			t.Fatalf("training did not reach step %d", step)
			return nil
		}
	}

	resume := waitPause(at)
	cks := h.snapshotAll(ctx, at)
	close(resume)
	// What the chief does: commit the manifest with the positions (the
	// furthest any shard counted) ...
	h.commit(at, cks)

	// ... and when a PS comes back, restore every shard from it.
	resume = waitPause(until)
	h.restoreAll(2, at)
	close(resume)

	h.check(func(gen, v, final int64) bool { return (gen == 1 && v < at) || (gen == 2 && v < final) })
	// The abandoned timeline did count gradients (which the model does
	// not hold): the test rolled real work back.
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	lost := 0
	for _, p := range h.l.pushes {
		if p.gen == 1 && p.version >= at && p.outcome == pb.PushResponse_APPLIED {
			lost++
		}
	}
	if lost == 0 {
		t.Fatal("no gradient of the rolled-back timeline was counted: nothing was rolled back")
	}
	t.Logf("%d gradients of the abandoned timeline rolled back", lost)
}

// snapshotAll has every shard checkpoint version at, as the chief orders
// a checkpoint.
func (h *posHarness) snapshotAll(ctx context.Context, at int64) []*pb.CheckpointResponse {
	t := h.t
	t.Helper()
	cks := make([]*pb.CheckpointResponse, h.run.PS)
	for s := range h.run.PS {
		ck, err := h.c.PS(s).Client().Checkpoint(ctx, &pb.CheckpointRequest{Step: at, AtVersion: at, RunId: "test"})
		if err != nil {
			t.Fatalf("ps/%d: %v", s, err)
		}
		cks[s] = ck
	}
	return cks
}

// commit commits the manifest of the shards' checkpoints cks at version
// at, with every worker's furthest data position, as the chief does, and
// checks those positions are at for both workers.
func (h *posHarness) commit(at int64, cks []*pb.CheckpointResponse) {
	t := h.t
	t.Helper()
	var positions []int64
	var infos []checkpoint.ShardInfo
	for s, ck := range cks {
		if ck.Version != at {
			t.Fatalf("ps/%d snapshotted version %d, want %d", s, ck.Version, at)
		}
		infos = append(infos, checkpoint.ShardInfo{Index: s, File: ck.File, SHA256: ck.Sha256, Bytes: ck.Bytes, Tensors: ck.Tensors, Version: ck.Version})
		if positions == nil {
			positions = make([]int64, len(ck.DataPositions))
		}
		for w, p := range ck.DataPositions {
			positions[w] = max(positions[w], p)
		}
	}
	if !slices.Equal(positions, []int64{at, at}) {
		t.Fatalf("data positions in the checkpoint %v, want [%d %d]", positions, at, at)
	}
	store := h.c.Checkpoints()
	if err := store.Commit(checkpoint.Manifest{Step: at, Version: at, Mode: "sync", ModelSpec: posSpec.JSON(),
		Shards: infos, DataPositions: positions}); err != nil {
		t.Fatal(err)
	}
}

// restoreAll re-initialises every shard in generation gen from the
// checkpoint of step at, as the chief does when a PS comes back in sync
// mode.
func (h *posHarness) restoreAll(gen, at int64) {
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
	var shards []shardState
	for s := range h.run.PS {
		p, o := st.Shard(h.c.Plan(), s)
		shards = append(shards, shardState{params: p, opt: o, optSteps: st.OptimizerSteps, version: loaded.Manifest.Version})
	}
	h.initAll(gen, shards, loaded.Manifest.DataPositions)
}

// A backup worker's gradient that loses the race is dropped (stale on
// every shard): its batch is used again, so no sample is skipped, and
// none is used twice.
func TestDroppedGradientsBatchIsUsedAgain(t *testing.T) {
	h := newPosHarness(t, config.Sync, 3, 2, false)
	// The run must last until worker 2 has taken a batch again (in a
	// few milliseconds workers 0 and 1 can finish it first): they wait
	// for worker 2's first pull after their first pull, and for its
	// second batch before their push of step gate. (Worker 2's second
	// step is an odd one, which does not wait for them.)
	batchesOf2 := func() int {
		h.l.mu.Lock()
		defer h.l.mu.Unlock()
		n := 0
		for _, b := range h.l.batches {
			if b.worker == 2 {
				n++
			}
		}
		return n
	}
	var pulled2 atomic.Bool
	const gate = 5
	wait := func(what string, cond func() bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := testcluster.WaitFor(ctx, what, cond); err != nil {
			t.Error(err)
		}
	}
	for w := range 2 {
		h.start(w, func(cfg *worker.Config, _ func()) {
			cfg.AfterPull = func(step int64) {
				if step == 0 {
					wait("worker 2's first pull", pulled2.Load)
				}
			}
			cfg.BeforePush = func(step int64) {
				if step == gate {
					wait("worker 2's second batch", func() bool { return batchesOf2() >= 2 })
				}
			}
		})
	}
	// Worker 2 straggles every other step: it pushes only once the others
	// have completed the step on every shard, so its gradient is stale
	// everywhere.
	versions := func() (lo int64, done bool) {
		lo = math.MaxInt64
		for s := range h.run.PS {
			st, err := h.c.PS(s).Status()
			if err != nil {
				t.Error(err)
				return 0, true
			}
			lo, done = min(lo, st.Version), done || st.Done
		}
		return lo, done
	}
	var pulled int64
	h.start(2, func(cfg *worker.Config, _ func()) {
		cfg.AfterPull = func(int64) {
			pulled, _ = versions()
			pulled2.Store(true)
		}
		cfg.BeforePush = func(step int64) {
			if step%2 == 1 {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := testcluster.WaitFor(ctx, "the step to complete without worker 2", func() bool {
				v, done := versions()
				return v > pulled || done
			}); err != nil {
				t.Error(err)
			}
		}
	})
	h.check(func(gen, v, final int64) bool { return gen == 1 && v < final })
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	stale, again := 0, 0
	seen := map[[2]int64]bool{}
	for _, p := range h.l.pushes {
		if p.outcome == pb.PushResponse_STALE {
			stale++
		}
	}
	for _, b := range h.l.batches {
		k := [2]int64{int64(b.worker), b.pos}
		if seen[k] {
			again++
		}
		seen[k] = true
	}
	if stale == 0 || again == 0 {
		t.Fatalf("%d stale pushes, %d batches taken again: the test did not drop a gradient", stale, again)
	}
	t.Logf("%d stale pushes, %d batches taken again", stale, again)
}

// pullAs pulls shard p's parameters as worker w.
func pullAs(t *testing.T, p *testcluster.PS, w int) (*pb.PullResponse, error) {
	t.Helper()
	client, err := p.ClientAs(w)
	if err != nil {
		t.Fatal(err)
	}
	return client.Pull(context.Background(), &pb.PullRequest{Worker: int32(w), RunId: "test"})
}
