package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/syncbuf"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/worker"
)

// The tests here kill a sync worker between its pushes of one step: its
// gradient reaches one shard (ps/0, or ps/1, the shard a step pushes
// early), which completes the step, and never the other, which waits for
// it. Nobody drops the worker from the live set (no chief, or a
// chief whose heartbeat timeout the replacement beats), so ps/1's step
// can only complete with a gradient from a worker that has not
// contributed to it: the catch-up (ps.Align).

// dieBetweenPushes kills a worker incarnation between its pushes of the
// first step it pushes at version at or later: as soon as its push to
// shard first has returned. Its push to the other shard of that step is
// held until then, so it is never sent: neither gRPC nor the data plane
// sends a call whose context has ended.
type dieBetweenPushes struct {
	at      int64
	first   int
	kill    func()
	once    sync.Once
	killed  chan struct{}
	version int64 // the version of the step it died in, once killed is closed
}

func newDieBetweenPushes(at int64, first int, kill func()) *dieBetweenPushes {
	return &dieBetweenPushes{at: at, first: first, kill: kill, killed: make(chan struct{})}
}

// wrap puts the worker's clients behind d.
func (d *dieBetweenPushes) wrap(cfg *worker.Config) {
	for s := range cfg.Shards {
		cfg.Shards[s].Client = &splitPlane{DataPlane: cfg.Shards[s].Client, d: d, shard: s}
	}
}

type splitPlane struct {
	worker.DataPlane
	d     *dieBetweenPushes
	shard int
}

func (p *splitPlane) Push(ctx context.Context, in *pb.PushRequest, opts ...grpc.CallOption) (*pb.PushResponse, error) {
	d := p.d
	switch {
	case in.Version < d.at:
	case p.shard == d.first:
		resp, err := p.DataPlane.Push(ctx, in, opts...)
		d.once.Do(func() {
			d.version = in.Version
			d.kill()
			close(d.killed)
		})
		return resp, err
	default:
		select {
		case <-d.killed:
		case <-ctx.Done():
		}
	}
	return p.DataPlane.Push(ctx, in, opts...)
}

// A sync worker killed between its pushes, and nobody takes it out of the
// live set: its replacement (same index, before any heartbeat timeout)
// or, with backup workers, a worker that has not contributed to the
// behind shard's step pushes it a catch-up gradient, which completes the
// step; the run trains to its last step. The data-position ledger still
// finds every sample used once per epoch (the catch-up's batch is held
// by the behind shard only, as a batch of a worker that died between its
// pushes is held by the other only). Either shard may be the one behind:
// ps/1 when the worker dies after its push to ps/0, ps/0 when it dies
// after the push to ps/1 that its step sends early (early_push.go), while it
// still computes ps/0's rows.
func TestWorkerKilledBetweenPushesCatchUp(t *testing.T) {
	const killAt = 8
	for _, tc := range []struct {
		name              string
		workers, replicas int
		// replacement starts after the kill: worker 1 again, or worker 2,
		// a backup worker that had not run (worker 1 never comes back;
		// the behind shard needs two gradients of its step, and only
		// worker 0's is there).
		replacement int
		first       int // the shard the dying worker's push reaches
	}{
		{"restarted", 2, 0, 1, 0},
		{"backup worker", 3, 2, 2, 0},
		{"restarted, ps/0 behind", 2, 0, 1, 1},
		{"backup worker, ps/0 behind", 3, 2, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newPosHarness(t, config.Sync, tc.workers, tc.replicas, false)
			var d *dieBetweenPushes
			w1 := h.start(1, func(cfg *worker.Config, kill func()) {
				d = newDieBetweenPushes(killAt, tc.first, kill)
				d.wrap(cfg)
			})
			h.start(0, nil)
			h.waitDone(w1)
			if d == nil {
				t.Fatal("worker 1 never built its clients")
			}
			<-d.killed
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			waitSplit(ctx, t, h.c, d.version, tc.first)
			inc := int(h.incs.Load()) + 1
			h.start(tc.replacement, nil)
			h.check(func(gen, v, final int64) bool { return gen == 1 && v < final })
			h.assertCaughtUp(inc, tc.replacement, d.version, 1-tc.first)
		})
	}
}

// waitSplit waits until shard ahead (0 or 1) has completed the step at
// version v, which the other still waits for: the step's gradient of the
// worker that died in it reached shard ahead only.
func waitSplit(ctx context.Context, t *testing.T, c *testcluster.Cluster, v int64, ahead int) {
	t.Helper()
	if err := testcluster.WaitFor(ctx, fmt.Sprintf("ps/%d to complete the step", ahead), func() bool {
		st, err := c.PS(ahead).Status()
		return err == nil && st.Version > v
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := c.PS(1 - ahead).Status(); err != nil || st.Version != v {
		t.Fatalf("ps/%d at version %d (%v), want %d: the push did not die half way", 1-ahead, st.GetVersion(), err, v)
	}
}

// assertCaughtUp checks that incarnation inc of worker w completed shard
// behind's step at version v with a push to that shard alone.
func (h *posHarness) assertCaughtUp(inc, w int, v int64, behind int) {
	t := h.t
	t.Helper()
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	shards := map[int][]int{} // tag -> the shards its batch was pushed to
	counted := -1
	for _, p := range h.l.pushes {
		if p.worker != w || h.l.batches[p.tag].inc != inc {
			continue
		}
		shards[p.tag] = append(shards[p.tag], p.shard)
		if p.shard == behind && p.version == v && p.outcome == pb.PushResponse_APPLIED {
			counted = p.tag
		}
	}
	if counted < 0 {
		t.Fatalf("no gradient of worker %d (incarnation %d) was counted in ps/%d's step at version %d", w, inc, behind, v)
	}
	if s := shards[counted]; len(s) != 1 {
		t.Fatalf("the gradient that completed ps/%d's step at version %d went to shards %v, want ps/%d alone (a catch-up)", behind, v, s, behind)
	}
	t.Logf("worker %d (incarnation %d) caught ps/%d up at version %d with its batch %d", w, inc, behind, v, h.l.batches[counted].pos)
}

// A worker dying between its pushes, with the chief: 2 workers, sync, the TCP data
// plane; worker 1 dies between its pushes and is back before the chief's
// heartbeat timeout (3 s), so the live set never changes. The run trains
// every step of its epochs.
func TestWorkerKilledBetweenPushesWithChief(t *testing.T) {
	const dim, classes, killAt = 16, 4, 20
	run := config.Default()
	run.Hidden, run.Batch, run.LR, run.TargetAccuracy, run.Epochs = []int{16}, 16, 0.05, 0, 6
	run.LRSchedule = "constant"
	if run.Mode != config.Sync || run.DataPlane != config.TCP || run.Replicas() != run.Workers || run.HeartbeatTimeout < time.Second {
		t.Fatalf("the default run is no longer sync over TCP with R = all workers and a heartbeat timeout of seconds: %+v", run)
	}
	var logs syncbuf.Buffer
	train, test := testcluster.SyntheticSplit(512, 128, dim, classes, 1)
	c := testcluster.New(t, testcluster.Config{Run: run, Spec: run.Spec(dim, classes), Train: train,
		Log:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Chief: &testcluster.ChiefConfig{Test: test, PollEvery: 10 * time.Millisecond}})
	if maxSteps := chief.MaxSteps(run, train.N); maxSteps <= 2*killAt {
		t.Fatalf("the run has %d steps: too few to kill a worker at step %d", maxSteps, killAt)
	}
	if _, err := c.StartWorker(0, testcluster.WorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	dying, die := context.WithCancel(context.Background())
	defer die()
	d := newDieBetweenPushes(killAt, 0, die)
	old, err := c.StartWorker(1, testcluster.WorkerOptions{Context: dying, Tweak: d.wrap})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := old.Wait(ctx); err == nil || dying.Err() == nil {
		t.Fatalf("worker/1 ended with %v before it was killed", err)
	}
	waitSplit(ctx, t, c, d.version, 0)
	if _, err := c.StartWorker(1, testcluster.WorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := c.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := chief.MaxSteps(run, train.N); rep.StoppedBy != "epochs" || rep.GlobalSteps != want {
		t.Fatalf("stopped by %q after %d global steps, want epochs after %d", rep.StoppedBy, rep.GlobalSteps, want)
	}
	if !strings.Contains(logs.String(), "catch-up gradient") {
		t.Fatalf("the run finished without a catch-up: did worker 1 die between its pushes (at version %d)?\n%s", d.version, logs.String())
	}
	t.Logf("killed at version %d; %d global steps; restarts %+v", d.version, rep.GlobalSteps, rep.Restarts)
}
