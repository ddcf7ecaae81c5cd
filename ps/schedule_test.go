package ps

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// A shard with a step schedule applies the scheduled rate at each
// version: plain SGD from 0 with gradient 1 moves the parameter by -lr(v).
func TestShardAppliesStepSchedule(t *testing.T) {
	sched, err := optim.ParseSchedule("step:1:0.5")
	if err != nil {
		t.Fatal(err)
	}
	// An epoch is 2 versions: lr 0.8, 0.8, 0.4, 0.4, 0.2, 0.2.
	lr, err := optim.NewLRSchedule(0.8, sched, 0, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{0.8, 0.8, 0.4, 0.4, 0.2, 0.2}
	for _, mode := range []config.Mode{config.Sync, config.Async, config.SSP} {
		for _, workers := range []int{1, 2} {
			s := newTestShard(t, ShardConfig{Mode: mode, Replicas: workers, Workers: workers, Staleness: 100, LR: lr}, 1)
			var p float32
			for v, w := range want {
				before := s.Version()
				for wk := range workers {
					if mode == config.Sync {
						_, err = s.Push(wk, before, grad(1))
					} else if wk == 0 {
						_, err = s.Push(wk, before, grad(1))
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				p -= w
				if s.Version() != before+1 || s.Params()[0] != p {
					t.Fatalf("%s, %d workers, update %d: version %d, param %v; want %d, %v (lr %v)",
						mode, workers, v, s.Version(), s.Params()[0], before+1, p, w)
				}
			}
		}
	}
}

// The last gradient of a sync step that comes through SetLive (a dead
// worker's step completing) gets the scheduled rate too, and so does a
// shard restored at a later version.
func TestShardScheduleOnMembershipAndRestore(t *testing.T) {
	lr, err := optim.NewLRSchedule(1, optim.Schedule{}, 4, 0, 0) // warmup: 0.25, 0.5, 0.75, 1, 1...
	if err != nil {
		t.Fatal(err)
	}
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2, LR: lr}, 1)
	if _, err := s.Push(0, 0, grad(1)); err != nil {
		t.Fatal(err)
	}
	if !s.SetLive([]int{0}) || s.Params()[0] != -0.25 {
		t.Fatalf("step completed by membership: param %v, want -0.25", s.Params()[0])
	}
	opt, _ := optim.New(optim.Config{Name: "sgd", LR: 1}, 1)
	r, err := NewShard(ShardConfig{Mode: config.Async, Workers: 1, LR: lr}, []float32{0}, opt, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []float32{-0.75, -1.75, -2.75} {
		if _, err := r.Push(0, r.Version(), grad(1)); err != nil {
			t.Fatal(err)
		}
		if r.Params()[0] != want {
			t.Fatalf("restored at version 2: param %v, want %v", r.Params()[0], want)
		}
	}
}

// Without a schedule the shard never touches the optimizer's rate.
func TestShardWithoutScheduleKeepsOptimizerRate(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Async, Workers: 1}, 1)
	s.Optimizer().SetLR(0.5)
	if _, err := s.Push(0, 0, grad(1)); err != nil {
		t.Fatal(err)
	}
	if s.Params()[0] != -0.5 {
		t.Fatalf("param %v, want -0.5", s.Params()[0])
	}
}

// Init builds the schedule from the run configuration and the request's
// steps per epoch and last version; a schedule the request cannot support
// is a clear InvalidArgument, not a division by zero.
func TestInitBuildsSchedule(t *testing.T) {
	initWith := func(lrSchedule string, warmup int64, stepsPerEpoch float64, maxVersion int64) (*Server, error) {
		r := config.Default()
		r.Mode, r.Workers, r.PS, r.Optimizer, r.LR = config.Async, 1, 1, "sgd", 1
		r.LRSchedule, r.WarmupSteps = lrSchedule, warmup
		srv := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
		_, err := srv.Init(context.Background(), &pb.InitRequest{RunId: "r", NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
			Params: wire.Bytes([]float32{0}), MaxVersion: maxVersion, StepsPerEpoch: stepsPerEpoch})
		return srv, err
	}
	for _, c := range []struct {
		sched         string
		stepsPerEpoch float64
		maxVersion    int64
		want          string
	}{
		{"step:1:0.5", 0, 100, "needs the number of steps per epoch, got 0 (init request: steps_per_epoch 0, max_version 100)"},
		{"cosine", 10, 0, "needs the run's last step"},
		{"step:x:1", 10, 100, `lr_schedule "step:x:1"`},
	} {
		_, err := initWith(c.sched, 0, c.stepsPerEpoch, c.maxVersion)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want InvalidArgument containing %q", c.sched, err, c.want)
		}
	}
	srv, err := initWith("cosine", 2, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	// lr(v) = cos factor x warmup: v0 1x0.5, v1 0.853553x1, v2 0.5, v3 0.146447.
	var p float64
	for v := range 4 {
		resp, err := srv.Push(context.Background(), &pb.PushRequest{RunId: "r", Worker: 0, Version: int64(v), Grad: wire.Bytes([]float32{1})})
		if err != nil || resp.Version != int64(v+1) {
			t.Fatalf("push %d: %v %v", v, resp, err)
		}
		p -= float64(float32(0.5 * (1 + math.Cos(math.Pi*float64(v)/4)) * min(1, float64(v+1)/2)))
		_, params, _, _, _ := srv.Snapshot()
		if math.Abs(float64(params[0])-p) > 1e-6 {
			t.Fatalf("after version %d: param %v, want %v", v, params[0], p)
		}
	}
}
