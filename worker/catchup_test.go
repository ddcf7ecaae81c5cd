package worker_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/inproc"
	"github.com/pstrain/pstrain/internal/syncbuf"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/worker"
)

// The tests here kill a sync worker between its pushes of one step: its
// gradient reaches ps/0, which completes the step, and never ps/1, which
// waits for it. Nobody drops the worker from the live set (no chief, or a
// chief whose heartbeat timeout the replacement beats), so ps/1's step
// can only complete with a gradient from a worker that has not
// contributed to it: the catch-up (ps.Align).

// dieBetweenPushes kills a worker incarnation between its pushes of the
// first step it pushes at version at or later: as soon as its push to
// ps/0 has returned. Its push to ps/1 of that step is held until then, so
// it is never sent: neither gRPC nor the data plane sends a call whose
// context has ended.
type dieBetweenPushes struct {
	at      int64
	kill    func()
	once    sync.Once
	killed  chan struct{}
	version int64 // the version of the step it died in, once killed is closed
}

func newDieBetweenPushes(at int64, kill func()) *dieBetweenPushes {
	return &dieBetweenPushes{at: at, kill: kill, killed: make(chan struct{})}
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
	case p.shard == 0:
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
// or, with backup workers, a worker that has not contributed to ps/1's
// step pushes ps/1 a catch-up gradient, which completes the step; the run
// trains to its last step. The data-position ledger still finds every
// sample used once per epoch (the catch-up's batch is held by ps/1 only,
// as a batch of a worker that died between its pushes is held by ps/0
// only).
func TestWorkerKilledBetweenPushesCatchUp(t *testing.T) {
	const killAt = 8
	for _, tc := range []struct {
		name              string
		workers, replicas int
		// replacement starts after the kill: worker 1 again, or worker 2,
		// a backup worker that had not run (worker 1 never comes back;
		// ps/1 needs two gradients of its step, and only worker 0's is
		// there).
		replacement int
	}{
		{"restarted", 2, 0, 1},
		{"backup worker", 3, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newPosHarness(t, config.Sync, tc.workers, tc.replicas, false)
			var d *dieBetweenPushes
			w1 := h.start(1, func(cfg *worker.Config, kill func()) {
				d = newDieBetweenPushes(killAt, kill)
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
			waitSplit(ctx, t, h.c, d.version)
			inc := int(h.incs.Load()) + 1
			h.start(tc.replacement, nil)
			h.check(func(gen, v, final int64) bool { return gen == 1 && v < final })
			h.assertCaughtUp(inc, tc.replacement, d.version)
		})
	}
}

// waitSplit waits until ps/0 has completed the step at version v, which
// ps/1 still waits for: the step's gradient of the worker that died in it
// reached ps/0 only.
func waitSplit(ctx context.Context, t *testing.T, c *inproc.Cluster, v int64) {
	t.Helper()
	if err := inproc.WaitFor(ctx, "ps/0 to complete the step", func() bool {
		st, err := c.PS(0).Status()
		return err == nil && st.Version > v
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := c.PS(1).Status(); err != nil || st.Version != v {
		t.Fatalf("ps/1 at version %d (%v), want %d: the push did not die half way", st.GetVersion(), err, v)
	}
}

// assertCaughtUp checks that incarnation inc of worker w completed
// ps/1's step at version v with a push to ps/1 alone.
func (h *posHarness) assertCaughtUp(inc, w int, v int64) {
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
		if p.shard == 1 && p.version == v && p.outcome == pb.PushResponse_APPLIED {
			counted = p.tag
		}
	}
	if counted < 0 {
		t.Fatalf("no gradient of worker %d (incarnation %d) was counted in ps/1's step at version %d", w, inc, v)
	}
	if s := shards[counted]; len(s) != 1 {
		t.Fatalf("the gradient that completed ps/1's step at version %d went to shards %v, want ps/1 alone (a catch-up)", v, s)
	}
	t.Logf("worker %d (incarnation %d) caught ps/1 up at version %d with its batch %d", w, inc, v, h.l.batches[counted].pos)
}

// The reviewers' case, with the chief: 2 workers, sync, the TCP data
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
	train, test := inproc.SyntheticSplit(512, 128, dim, classes, 1)
	c := inproc.New(t, inproc.Config{Run: run, Spec: run.Spec(dim, classes), Train: train,
		Log:   slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Chief: &inproc.ChiefConfig{Test: test, PollEvery: 10 * time.Millisecond}})
	if maxSteps := chief.MaxSteps(run, train.N); maxSteps <= 2*killAt {
		t.Fatalf("the run has %d steps: too few to kill a worker at step %d", maxSteps, killAt)
	}
	if _, err := c.StartWorker(0, inproc.WorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	dying, die := context.WithCancel(context.Background())
	defer die()
	d := newDieBetweenPushes(killAt, die)
	old, err := c.StartWorker(1, inproc.WorkerOptions{Context: dying, Tweak: d.wrap})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := old.Wait(ctx); err == nil || dying.Err() == nil {
		t.Fatalf("worker/1 ended with %v before it was killed", err)
	}
	waitSplit(ctx, t, c, d.version)
	if _, err := c.StartWorker(1, inproc.WorkerOptions{}); err != nil {
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
