package worker_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/transport/wire"
	"github.com/pstrain/pstrain/worker"
)

// slice is the batch source of worker `index` of `m`: at its step t it
// yields rows [index*b, (index+1)*b) of the global batch t of size m*b,
// global batch t being samples t*m*b .. (t+1)*m*b-1 modulo n.
type slice struct {
	d           *dataset.Dataset
	index, m, b int
	t           int
}

func (s *slice) Next(x []float32, y []uint8) {
	for r := 0; r < s.b; r++ {
		i := (s.t*s.m*s.b + s.index*s.b + r) % s.d.N
		copy(x[r*s.d.Dim:(r+1)*s.d.Dim], s.d.Image(i))
		y[r] = s.d.Labels[i]
	}
	s.t++
}

func (s *slice) SeekBatch(p int64) { s.t = int(p) }

// mechanismLR is the step size of the tests about a mechanism (backup
// workers, membership, the SSP bound) rather than learning: not the
// default, so that a default tuned for MNIST cannot make the tiny model
// diverge, whose NaN gradient would stop a worker (--nan-policy reject)
// and, in SSP, hold the others at the bound.
const mechanismLR = 0.05

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startCluster runs run.PS shard servers over bufconn (and the TCP data
// plane if run.DataPlane is config.TCP), initialised with spec.Init(seed),
// training ending at maxVersion. There is no chief: the tests stand in
// for it where they need one.
func startCluster(t *testing.T, run config.Run, spec model.Spec, maxVersion int64) *testcluster.Cluster {
	t.Helper()
	return testcluster.New(t, testcluster.Config{Run: run, Spec: spec, MaxVersion: maxVersion, Log: quietLog(), RetryTimeout: 5 * time.Second})
}

// startWorker starts worker index reading src, its configuration
// adjusted by tweak (if not nil); it is killed when parent ends (and when
// the cluster closes).
func startWorker(t *testing.T, c *testcluster.Cluster, parent context.Context, index int, src worker.BatchSource, tweak func(*worker.Config)) *testcluster.Worker {
	t.Helper()
	w, err := c.StartWorker(index, testcluster.WorkerOptions{Context: parent, Tweak: tweak,
		Batches: func(int, int) worker.BatchSource { return src }})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// params reassembles the full model from every shard.
func params(t *testing.T, c *testcluster.Cluster) ([][]float32, []int64) {
	t.Helper()
	p, versions, err := c.Params()
	if err != nil {
		t.Fatal(err)
	}
	return p, versions
}

// waitAll waits for every worker to finish and fails the test on any
// error: every worker's, so that when one hangs the others' tell why.
func waitAll(t *testing.T, c *testcluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitWorkers(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSyncEqualsBigBatch is the proof that sync mode is synchronous SGD:
// M workers of batch b, aggregated by 2 shards, reach the same weights as
// one process training with batch M*b on the same data in the same order.
func TestSyncEqualsBigBatch(t *testing.T) {
	for _, plane := range []config.DataPlane{config.GRPC, config.TCP} {
		t.Run(string(plane), func(t *testing.T) { testSyncEqualsBigBatch(t, plane) })
	}
}

// The sync cluster of the equivalence tests: m workers of batch b on 2
// shards, momentum, over plane with gradients sent as dtype.
const syncM, syncB = 3, 8

var syncSpec = model.Spec{Input: 24, Hidden: []int{16, 12}, Classes: 5}

// trainSync runs that cluster for steps sync steps on its synthetic data
// (worker i takes the i-th b rows of every m*b) and returns the weights,
// the run and the data.
func trainSync(t *testing.T, plane config.DataPlane, dtype config.WireDType, steps int64) ([][]float32, config.Run, *dataset.Dataset) {
	t.Helper()
	run := config.Default()
	run.LRSchedule = "constant" // the update rule under test, not the schedule
	run.DataPlane, run.WireDType = plane, dtype
	run.PS, run.Workers, run.Batch, run.Seed, run.Hidden = 2, syncM, syncB, 7, syncSpec.Hidden
	run.LR, run.Momentum, run.Optimizer = 0.05, 0.9, "momentum"
	data := testcluster.Synthetic(500, syncSpec.Input, syncSpec.Classes, 3)

	c := startCluster(t, run, syncSpec, steps)
	var ws []*testcluster.Worker
	for i := 0; i < syncM; i++ {
		ws = append(ws, startWorker(t, c, context.Background(), i, &slice{d: data, index: i, m: syncM, b: syncB}, nil))
	}
	waitAll(t, c)
	// Shard 1 holds the first layer's later rows and the layers above:
	// each step pushed it early, while the first rows were computed
	// (early_push.go), and the comparisons below cover that path.
	for _, w := range ws {
		if done, _ := w.Progress(); w.EarlyPushes() != done || done == 0 {
			t.Fatalf("worker %d pushed %d shards early in %d steps, want one a step", w.Index(), w.EarlyPushes(), done)
		}
	}
	got, versions := params(t, c)
	for _, v := range versions {
		if v != steps {
			t.Fatalf("shard versions %v, want all %d", versions, steps)
		}
	}
	return got, run, data
}

// gradsOn runs net's step on src's next batch and returns the gradients.
func gradsOn(t *testing.T, net *nn.Net, src worker.BatchSource, y []uint8) [][]float32 {
	t.Helper()
	src.Next(net.Input(), y)
	net.SetLabels(y)
	if _, err := net.Step(); err != nil {
		t.Fatal(err)
	}
	gs, err := net.Grads()
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

// maxDiff is the largest |a - b| over a model's weights.
func maxDiff(a, b [][]float32) float64 {
	worst := 0.0
	for i := range a {
		for j := range a[i] {
			worst = math.Max(worst, math.Abs(float64(a[i][j]-b[i][j])))
		}
	}
	return worst
}

func testSyncEqualsBigBatch(t *testing.T, plane config.DataPlane) {
	const m, b, steps = syncM, syncB, 60
	spec := syncSpec
	got, run, data := trainSync(t, plane, config.F32, steps)

	// The single-process reference.
	ref, err := nn.New(spec, m*b, true)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	var opts []optim.Optimizer
	for i, w := range spec.Init(uint64(run.Seed)) {
		copy(ref.Params()[i], w)
		o, _ := optim.New(optim.Config{Name: "momentum", LR: run.LR, Momentum: run.Momentum}, len(w))
		opts = append(opts, o)
	}
	src := &slice{d: data, index: 0, m: 1, b: m * b}
	y := make([]uint8, m*b)
	for s := 0; s < steps; s++ {
		gs := gradsOn(t, ref, src, y)
		for i := range gs {
			opts[i].Apply(ref.Params()[i], gs[i], 1)
		}
	}
	worst := maxDiff(got, ref.Params())
	if worst > 1e-4 {
		t.Fatalf("sync cluster and big-batch reference differ by up to %g", worst)
	}
	// The weights moved: the comparison is not trivially between two inits.
	init := spec.Init(uint64(run.Seed))
	if d := math.Abs(float64(got[0][0] - init[0][0])); d == 0 {
		t.Fatal("weights never changed")
	}
	t.Logf("max |difference| after %d steps: %g", steps, worst)
}

// With --wire-dtype bf16 a sync cluster is SGD on the average of the
// workers' gradients each rounded to bfloat16: the reference computes
// every worker's gradient on its own batch, rounds it, and averages.
func TestSyncBF16IsSGDOnRoundedGradients(t *testing.T) {
	for _, plane := range []config.DataPlane{config.GRPC, config.TCP} {
		t.Run(string(plane), func(t *testing.T) { testSyncBF16(t, plane) })
	}
}

func testSyncBF16(t *testing.T, plane config.DataPlane) {
	const m, b, steps = syncM, syncB, 40
	spec := syncSpec
	got, run, data := trainSync(t, plane, config.BF16, steps)

	ref, err := nn.New(spec, b, true)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	var opts []optim.Optimizer
	sum := make([][]float32, len(spec.Init(uint64(run.Seed))))
	for i, w := range spec.Init(uint64(run.Seed)) {
		copy(ref.Params()[i], w)
		o, _ := optim.New(optim.Config{Name: "momentum", LR: run.LR, Momentum: run.Momentum}, len(w))
		opts = append(opts, o)
		sum[i] = make([]float32, len(w))
	}
	var srcs []*slice
	for i := 0; i < m; i++ {
		srcs = append(srcs, &slice{d: data, index: i, m: m, b: b})
	}
	y := make([]uint8, b)
	rounded := 0
	for s := 0; s < steps; s++ {
		for i := range sum {
			clear(sum[i])
		}
		for _, src := range srcs {
			gs := gradsOn(t, ref, src, y)
			for i := range gs {
				for j, g := range gs[i] {
					r := wire.FromBF16(wire.BF16(g))
					if r != g {
						rounded++
					}
					sum[i][j] += r
				}
			}
		}
		for i := range sum {
			opts[i].Apply(ref.Params()[i], sum[i], 1/float32(m))
		}
	}
	if rounded == 0 {
		t.Fatal("no gradient value changed in rounding: the test proves nothing")
	}
	worst := maxDiff(got, ref.Params())
	if worst > 1e-4 {
		t.Fatalf("bf16 sync cluster and the rounded-gradient reference differ by up to %g", worst)
	}
	t.Logf("max |difference| after %d steps: %g", steps, worst)
}

func countingSource(d *dataset.Dataset, b int, seed uint64) worker.BatchSource {
	return &slice{d: d, index: int(seed), m: 5, b: b}
}

// TestBackupWorkersAndStaleDrops: 3 workers, R=2. Every step completes with
// the first two gradients; late ones are dropped and counted.
func TestBackupWorkersAndStaleDrops(t *testing.T) {
	spec := model.Spec{Input: 16, Hidden: []int{8}, Classes: 3}
	run := config.Default()
	run.LRSchedule = "constant" // the update rule under test, not the schedule
	run.PS, run.Workers, run.ReplicasToAggregate, run.Batch, run.Hidden = 2, 3, 2, 8, spec.Hidden
	run.LR = mechanismLR
	data := testcluster.Synthetic(300, spec.Input, spec.Classes, 5)
	const steps = 40
	c := startCluster(t, run, spec, steps)
	for i := 0; i < 3; i++ {
		startWorker(t, c, context.Background(), i, countingSource(data, run.Batch, uint64(i)), nil)
	}
	waitAll(t, c)
	// The shards aggregate independently, so training ends when the first
	// shard completes the last step; the others are at most one step short
	// (the workers stop as soon as they see one shard done).
	_, versions := params(t, c)
	finished := -1
	for s, v := range versions {
		if v == steps {
			finished = s
		} else if v != steps-1 {
			t.Fatalf("shard versions %v: want %d, or one short", versions, steps)
		}
	}
	if finished < 0 {
		t.Fatalf("no shard reached %d: %v", steps, versions)
	}
	st, _ := c.PS(finished).Status()
	// Each of the 40 steps took exactly 2 gradients.
	if st.Applied != 2*steps {
		t.Fatalf("applied %d gradients, want %d", st.Applied, 2*steps)
	}
	t.Logf("shard versions %v, stale gradients dropped on ps/%d: %d", versions, finished, st.StaleDropped)
}

// TestDeadWorkerDoesNotHangSync: R = 2 workers; one stops after 5 steps.
// Once the membership says it is gone, the other finishes alone.
func TestDeadWorkerDoesNotHangSync(t *testing.T) {
	spec := model.Spec{Input: 16, Hidden: []int{8}, Classes: 3}
	run := config.Default()
	run.LRSchedule = "constant" // the update rule under test, not the schedule
	run.PS, run.Workers, run.Batch, run.Hidden = 2, 2, 8, spec.Hidden
	run.LR = mechanismLR
	data := testcluster.Synthetic(300, spec.Input, spec.Classes, 5)
	const steps = 30
	c := startCluster(t, run, spec, steps)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dying, dyingCancel := context.WithCancel(ctx)
	w1 := startWorker(t, c, dying, 1, countingSource(data, run.Batch, 1), func(cfg *worker.Config) {
		cfg.BeforePush = func(step int64) {
			if step == 5 {
				dyingCancel() // killed before its 6th push
			}
		}
	})
	w0 := startWorker(t, c, ctx, 0, countingSource(data, run.Batch, 0), nil)
	<-w1.Done()
	// What the chief does when the heartbeat times out.
	for s := 0; s < run.PS; s++ {
		if _, err := c.PS(s).Client().SetMembership(ctx, &pb.MembershipRequest{LiveWorkers: []int32{0}}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-w0.Done():
		if err := w0.Err(); err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("sync training hung after a worker died")
	}
	if _, v := params(t, c); v[0] != steps {
		t.Fatalf("version %d, want %d", v[0], steps)
	}
}

// TestSSPBound: a deliberately slow worker; no worker may ever be more
// than `staleness` steps ahead of it. The observer counts a push before it
// is sent, so its view of the slowest worker is never behind the shards'.
func TestSSPBound(t *testing.T) {
	spec := model.Spec{Input: 16, Hidden: []int{8}, Classes: 3}
	run := config.Default()
	run.LRSchedule = "constant" // the update rule under test, not the schedule
	run.Mode, run.Staleness, run.PS, run.Workers, run.Batch, run.Hidden = config.SSP, 2, 2, 3, 8, spec.Hidden
	run.LR = mechanismLR
	data := testcluster.Synthetic(300, spec.Input, spec.Classes, 5)
	const total = 90
	c := startCluster(t, run, spec, total)
	var pushed [3]atomic.Int64
	var maxGap atomic.Int64
	for i := 0; i < 3; i++ {
		startWorker(t, c, context.Background(), i, countingSource(data, run.Batch, uint64(i)), func(cfg *worker.Config) {
			cfg.BeforePush = func(step int64) {
				if i == 2 {
					time.Sleep(3 * time.Millisecond) // the straggler
				}
				pushed[i].Add(1)
			}
			cfg.AfterPull = func(step int64) {
				lo := min(pushed[0].Load(), pushed[1].Load(), pushed[2].Load())
				gap := step - lo
				for {
					old := maxGap.Load()
					if gap <= old || maxGap.CompareAndSwap(old, gap) {
						break
					}
				}
			}
		})
	}
	waitAll(t, c)
	if g := maxGap.Load(); g > int64(run.Staleness) {
		t.Fatalf("a worker ran %d steps ahead of the slowest; bound is %d", g, run.Staleness)
	}
	if maxGap.Load() < int64(run.Staleness) {
		t.Logf("note: the bound was never reached (max gap %d)", maxGap.Load())
	}
	t.Logf("max gap %d, slow worker pushed %d of %d", maxGap.Load(), pushed[2].Load(), total)
}

// TestAsyncTrains: async mode applies every gradient; training reduces the
// loss on the synthetic task.
func TestAsyncTrains(t *testing.T) {
	spec := model.Spec{Input: 16, Hidden: []int{8}, Classes: 3}
	run := config.Default()
	run.LRSchedule = "constant" // the update rule under test, not the schedule
	run.Mode, run.PS, run.Workers, run.Batch, run.Hidden, run.LR = config.Async, 2, 2, 16, spec.Hidden, 0.05
	data := testcluster.Synthetic(300, spec.Input, spec.Classes, 5)
	const total = 200
	c := startCluster(t, run, spec, total)
	w0 := startWorker(t, c, context.Background(), 0, countingSource(data, run.Batch, 0), nil)
	w1 := startWorker(t, c, context.Background(), 1, countingSource(data, run.Batch, 1), nil)
	waitAll(t, c)
	st, _ := c.PS(1).Status()
	if st.Version != total || st.Applied != total || st.StaleDropped != 0 {
		t.Fatalf("async status %+v", st)
	}
	s0, l0 := w0.Progress()
	s1, _ := w1.Progress()
	if s0+s1 < total || l0 > 0.5 {
		t.Fatalf("steps %d+%d, last loss %v", s0, s1, l0)
	}
}
