package ps

import (
	"errors"
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/optim"
)

func newTestShard(t *testing.T, cfg ShardConfig, n int) *Shard {
	t.Helper()
	opt, err := optim.New(optim.Config{Name: "sgd", LR: 1}, n)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewShard(cfg, make([]float32, n), opt, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func grad(v ...float32) []float32 { return v }

func TestSyncAppliesMeanOfRAndDropsStale(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 3}, 2)
	if r, _ := s.Push(0, 0, grad(1, 2)); r.Advanced || r.Outcome != Applied {
		t.Fatalf("first of two gradients must not advance: %+v", r)
	}
	if s.PullReady(0, 1) {
		t.Fatal("pull for version 1 ready before the step completed")
	}
	if r, _ := s.Push(0, 0, grad(9, 9)); r.Outcome != Duplicate {
		t.Fatalf("second gradient from the same worker: %+v", r)
	}
	r, _ := s.Push(1, 0, grad(3, 4))
	if !r.Advanced || s.Version() != 1 {
		t.Fatalf("second worker's gradient must complete the step: %+v v=%d", r, s.Version())
	}
	// lr 1, mean (2,3): params = -(2,3)
	if p := s.Params(); p[0] != -2 || p[1] != -3 {
		t.Fatalf("params %v, want [-2 -3]", p)
	}
	// The backup worker's gradient for version 0 arrives late: dropped.
	if r, _ := s.Push(2, 0, grad(100, 100)); r.Outcome != Stale || r.Staleness != 1 {
		t.Fatalf("late backup gradient: %+v", r)
	}
	if p := s.Params(); p[0] != -2 {
		t.Fatal("stale gradient changed the parameters")
	}
	if st := s.Stats(); st.StaleDropped != 1 || st.Duplicates != 1 || st.Applied != 2 {
		t.Fatalf("stats %+v", st)
	}
	if !s.PullReady(2, 1) {
		t.Fatal("pull for version 1 should be ready")
	}
}

func TestSyncStepFollowsLiveMembership(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}, 1)
	s.Push(0, 0, grad(1))
	// Worker 1 dies: the step must complete with the one gradient it has.
	if !s.SetLive([]int{0}) || s.Version() != 1 {
		t.Fatalf("losing a worker should complete the pending step; version %d", s.Version())
	}
	if r, _ := s.Push(0, 1, grad(1)); !r.Advanced {
		t.Fatal("with one live worker each gradient is a step")
	}
	s.SetLive([]int{0, 1})
	if r, _ := s.Push(0, 2, grad(1)); r.Advanced {
		t.Fatal("with both workers back a step needs two gradients again")
	}
}

func TestRefusedPushesLeaveStateUnchanged(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Async, Workers: 2}, 2)
	nan := float32(0)
	nan = nan / nan
	cases := []struct {
		worker  int
		version int64
		g       []float32
		want    error
	}{
		{0, 5, grad(1, 1), ErrFutureVersion},
		{0, 0, grad(1), ErrBadLength},
		{7, 0, grad(1, 1), ErrBadWorker},
		{-1, 0, grad(1, 1), ErrBadWorker},
		{0, 0, grad(nan, 1), ErrNonFinite},
	}
	for _, c := range cases {
		if _, err := s.Push(c.worker, c.version, c.g); !errors.Is(err, c.want) {
			t.Errorf("push %+v: got %v, want %v", c, err, c.want)
		}
	}
	if s.Version() != 0 || s.Params()[0] != 0 || s.Params()[1] != 0 {
		t.Fatalf("refused pushes changed the shard: v=%d %v", s.Version(), s.Params())
	}
}

func TestAsyncAppliesEachGradientAndMeasuresStaleness(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Async, Workers: 2}, 1)
	s.Push(0, 0, grad(1))
	s.Push(0, 1, grad(1))
	r, _ := s.Push(1, 0, grad(1))
	if r.Staleness != 2 || s.Version() != 3 || s.Params()[0] != -3 {
		t.Fatalf("staleness %d version %d params %v", r.Staleness, s.Version(), s.Params())
	}
}

func TestSSPBlocksTheFastWorker(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.SSP, Workers: 2, Staleness: 2}, 1)
	for i := 0; i < 2; i++ {
		if !s.PullReady(0, 0) {
			t.Fatalf("worker 0 blocked after %d steps with staleness 2", i)
		}
		s.Push(0, s.Version(), grad(1))
	}
	if !s.PullReady(0, 0) {
		t.Fatal("2 ahead is within the bound")
	}
	s.Push(0, s.Version(), grad(1))
	if s.PullReady(0, 0) {
		t.Fatal("3 ahead of the slowest worker must block")
	}
	if !s.PullReady(-1, 0) {
		t.Fatal("the chief's reads never block")
	}
	s.Push(1, 0, grad(1))
	if !s.PullReady(0, 0) {
		t.Fatal("slow worker's progress must unblock the fast one")
	}
	// The slow worker dies: the fast one is bounded by nobody else.
	s.Push(0, s.Version(), grad(1))
	s.Push(0, s.Version(), grad(1))
	if s.PullReady(0, 0) {
		t.Fatal("should be blocked again")
	}
	s.SetLive([]int{0})
	if !s.PullReady(0, 0) {
		t.Fatal("a dead worker must not block the live ones")
	}
	// It comes back: it starts at the slowest live clock, not at its old one.
	s.SetLive([]int{0, 1})
	if s.Clock(1) != s.Clock(0) || !s.PullReady(0, 0) {
		t.Fatalf("rejoining worker clock %d, live %d", s.Clock(1), s.Clock(0))
	}
}

func TestMaxVersionEndsTraining(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 1, Workers: 1, MaxVersion: 2}, 1)
	s.Push(0, 0, grad(1))
	if s.Done() {
		t.Fatal("done too early")
	}
	s.Push(0, 1, grad(1))
	if !s.Done() || !s.PullReady(0, 99) {
		t.Fatal("shard must be done at MaxVersion and answer every pull")
	}
	if r, err := s.Push(0, 2, grad(1)); err != nil || r.Advanced || s.Version() != 2 {
		t.Fatalf("push after done: %+v %v", r, err)
	}
}

func TestConfigValidation(t *testing.T) {
	opt, _ := optim.New(optim.Config{Name: "sgd", LR: 1}, 1)
	if _, err := NewShard(ShardConfig{Mode: config.Sync, Replicas: 3, Workers: 2}, []float32{0}, opt, 0); err == nil {
		t.Fatal("replicas > workers accepted")
	}
	if _, err := NewShard(ShardConfig{Mode: config.Async}, []float32{0}, opt, 0); err == nil {
		t.Fatal("zero workers accepted")
	}
}
