package worker_test

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/transport/wire"
	"github.com/pstrain/pstrain/worker"
)

// syncShard is one sync shard of a one-worker run as the worker sees
// it: a push tagged with the current version completes the step; a pull
// waits for its MinVersion; the shard says done at last. staleOnce makes
// the pull it numbers (1 = the first) answer at once with the current
// version, whatever it asked for, as a shard restarted from an older
// checkpoint would.
type syncShard struct {
	size, last int
	staleOnce  int
	failPush   int // the push it numbers (1 = the first) fails for good

	mu      sync.Mutex
	changed chan struct{}
	version int64
	pulls   int
	tags    []int64 // the version each push was tagged with
	waiting bool    // a pull is waiting for a version past the current one
	overlap int     // pushes that found the next step's pull already waiting
}

func newSyncShard(size, last int) *syncShard {
	return &syncShard{size: size, last: last, changed: make(chan struct{})}
}

func (s *syncShard) notify() { close(s.changed); s.changed = make(chan struct{}) }

func (s *syncShard) Pull(ctx context.Context, in *pb.PullRequest, _ ...grpc.CallOption) (*pb.PullResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pulls++
	stale := s.pulls == s.staleOnce
	for !stale && s.version < in.MinVersion && s.version < int64(s.last) {
		s.waiting = true
		s.notify()
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			s.mu.Lock()
			s.waiting = false
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
	s.waiting = false
	return &pb.PullResponse{Version: s.version, Generation: 1, Done: s.version >= int64(s.last),
		Params: wire.Bytes(make([]float32, s.size)), DataPosition: s.version}, nil
}

// Push waits (up to a second) for the next step's pull to be waiting
// before it completes the step: with pulls on their own client it is.
func (s *syncShard) Push(ctx context.Context, in *pb.PushRequest, _ ...grpc.CallOption) (*pb.PushResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	deadline := time.After(time.Second)
	for !s.waiting {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
		case <-ctx.Done():
		}
		s.mu.Lock()
		if !s.waiting {
			break
		}
	}
	if s.waiting {
		s.overlap++
	}
	if len(s.tags)+1 == s.failPush {
		return nil, status.Error(codes.InvalidArgument, "this push is refused")
	}
	s.tags = append(s.tags, in.Version)
	if in.Version == s.version {
		s.version++
		s.notify()
	}
	return &pb.PushResponse{}, nil
}

func runOverlapped(t *testing.T, sh *syncShard, puller bool) {
	t.Helper()
	if err := runOverlappedErr(t, sh, puller); err != nil {
		t.Fatal(err)
	}
}

// runOverlappedErr is runOverlapped returning the worker's error.
func runOverlappedErr(t *testing.T, sh *syncShard, puller bool) error {
	t.Helper()
	spec := model.Spec{Input: 6, Hidden: []int{4}, Classes: 3}
	plan, err := partition.New(spec, 1)
	if err != nil {
		return err
	}
	sh.size = plan.Shards[0].Size
	net, err := nn.New(spec, 2, true)
	if err != nil {
		return err
	}
	defer net.Close()
	run := config.Default()
	run.Mode, run.PS, run.Workers, run.Batch = config.Sync, 1, 1, 2
	shard := worker.Shard{Addr: "fake", Client: sh}
	if puller {
		shard.Puller = sh
	}
	data := testcluster.Synthetic(20, spec.Input, spec.Classes, 1)
	w, err := worker.New(worker.Config{Index: 0, RunID: "r", Run: run, Plan: plan, Net: net, Shards: []worker.Shard{shard},
		Batches: &slice{d: data, m: 1, b: 2}, Log: quietLog()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return w.Run(ctx)
}

// With pulls on a client of their own, a sync step's pull is waiting at
// the shard when its push completes the step, and each step's push is
// tagged with the version the step computed on.
func TestSyncPullWaitsWhilePushing(t *testing.T) {
	sh := newSyncShard(0, 5)
	runOverlapped(t, sh, true)
	if want := []int64{0, 1, 2, 3, 4}; !slices.Equal(sh.tags, want) {
		t.Fatalf("pushes tagged %v, want %v", sh.tags, want)
	}
	if sh.overlap != 5 {
		t.Fatalf("%d of 5 pushes found the next pull waiting", sh.overlap)
	}
}

// An answer below the version the step completes (here: a shard that
// answers the overlapped pull at once, as one restarted from an older
// checkpoint would) is not used: the pull is made again after the push,
// so no step computes on a version twice.
func TestSyncOverlappedPullBelowTheStepIsRedone(t *testing.T) {
	sh := newSyncShard(0, 5)
	sh.staleOnce = 3 // the first pull, step 1's overlapped one, then step 2's
	runOverlapped(t, sh, true)
	if want := []int64{0, 1, 2, 3, 4}; !slices.Equal(sh.tags, want) {
		t.Fatalf("pushes tagged %v, want %v (a step computed on a stale answer)", sh.tags, want)
	}
}

// Without a puller the worker pulls after the push, as before.
func TestSyncWithoutPullerPullsAfterThePush(t *testing.T) {
	sh := newSyncShard(0, 3)
	runOverlapped(t, sh, false)
	if want := []int64{0, 1, 2}; !slices.Equal(sh.tags, want) {
		t.Fatalf("pushes tagged %v, want %v", sh.tags, want)
	}
	if sh.overlap != 0 {
		t.Fatalf("%d pushes found a pull waiting, with one client", sh.overlap)
	}
}

// A push that fails for good ends the run with its error, and the next
// step's pull, waiting at the shard for a version only that push would
// have completed, is cancelled instead of holding the worker.
func TestSyncFailedPushCancelsThePull(t *testing.T) {
	sh := newSyncShard(0, 5)
	sh.failPush = 3
	err := runOverlappedErr(t, sh, true)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("run: %v, want the push's InvalidArgument", err)
	}
	if want := []int64{0, 1}; !slices.Equal(sh.tags, want) {
		t.Fatalf("pushes tagged %v, want %v", sh.tags, want)
	}
}

// tickClock is a clock that moves a second each time it is read.
type tickClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *tickClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

// The step phases a worker observes are read on the clock it is given
// (Config.Clock), not the system's: with a clock that moves a whole
// second a read, every phase lasts whole seconds.
func TestPhasesReadTheInjectedClock(t *testing.T) {
	spec := model.Spec{Input: 6, Hidden: []int{4}, Classes: 3}
	plan, err := partition.New(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	sh := newSyncShard(plan.Shards[0].Size, 3)
	net, err := nn.New(spec, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	run := config.Default()
	run.Mode, run.PS, run.Workers, run.Batch = config.Sync, 1, 1, 2
	reg := prometheus.NewRegistry()
	w, err := worker.New(worker.Config{Index: 0, RunID: "r", Run: run, Plan: plan, Net: net,
		Shards: []worker.Shard{{Addr: "fake", Client: sh}}, Batches: &slice{d: testcluster.Synthetic(20, spec.Input, spec.Classes, 1), m: 1, b: 2},
		Log: quietLog(), Metrics: metrics.NewWorker(reg), Clock: &tickClock{now: time.Unix(0, 0)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	phases := 0
	for _, f := range families {
		if f.GetName() != metrics.MetricWorkerStepPhase {
			continue
		}
		for _, m := range f.GetMetric() {
			sum, n := m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
			if n == 0 {
				continue
			}
			phases++
			if sum < float64(n) || sum != math.Trunc(sum) {
				t.Errorf("%v: %d observations summing to %gs, want whole seconds, at least one each", m.GetLabel(), n, sum)
			}
		}
	}
	if phases != 3 {
		t.Fatalf("%d phases observed, want pull, compute and push", phases)
	}
}
