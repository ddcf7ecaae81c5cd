package worker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/transport/wire"
	"github.com/pstrain/pstrain/worker"
)

// asyncShard is an async shard of a one-worker run as the worker sees
// it: a pull is answered at once at the version (the pushes it took),
// a push moves the version on. Like gRPC, it sends no call whose
// context has ended.
type asyncShard struct {
	size int

	mu     sync.Mutex
	pushes int64
}

func (s *asyncShard) Pull(ctx context.Context, in *pb.PullRequest, _ ...grpc.CallOption) (*pb.PullResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &pb.PullResponse{Version: s.pushes, Generation: 1, Params: wire.Bytes(make([]float32, s.size)), DataPosition: s.pushes}, nil
}

func (s *asyncShard) Push(ctx context.Context, in *pb.PushRequest, _ ...grpc.CallOption) (*pb.PushResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pushes++
	return &pb.PushResponse{}, nil
}

func (s *asyncShard) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pushes
}

// A stop (Worker.RunStoppable, a change of the PS count) that comes
// while a step's pushes are about to go out lets them reach every shard:
// the step is in both shards or in neither. The same stop through Run's
// context cuts the pushes, none is sent (which is what makes the stop
// the gentler one).
func TestRunStoppableLetsThePushesThrough(t *testing.T) {
	const stopAt = 3
	for _, gentle := range []bool{true, false} {
		shards, err := runStoppedAt(t, stopAt, gentle)
		if err == nil {
			t.Fatalf("gentle=%t: Run ended without an error", gentle)
		}
		want := int64(stopAt)
		if gentle {
			want = stopAt + 1 // the stopped step's pushes went through
		}
		for s, sh := range shards {
			if got := sh.count(); got != want {
				t.Errorf("gentle=%t: shard %d took %d pushes, want %d", gentle, s, got, want)
			}
		}
	}
}

// runStoppedAt runs a worker on two asyncShards, stopped just before the
// pushes of step stopAt (gentle: through RunStoppable's stop, else
// through Run's context), and returns the shards and Run's error.
func runStoppedAt(t *testing.T, stopAt int64, gentle bool) ([]*asyncShard, error) {
	t.Helper()
	spec := model.Spec{Input: 6, Hidden: []int{4}, Classes: 3}
	plan, err := partition.New(spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	net, err := nn.New(spec, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	run := config.Default()
	run.Mode, run.PS, run.Workers, run.Batch = config.Async, 2, 1, 2
	fakes := []*asyncShard{{size: plan.Shards[0].Size}, {size: plan.Shards[1].Size}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop, stopNow := context.WithCancel(ctx)
	defer stopNow()
	cfg := worker.Config{Index: 0, RunID: "r", Run: run, Plan: plan, Net: net,
		Shards:  []worker.Shard{{Addr: "fake0", Client: fakes[0]}, {Addr: "fake1", Client: fakes[1]}},
		Batches: &slice{d: testcluster.Synthetic(20, spec.Input, spec.Classes, 1), m: 1, b: 2}, Log: quietLog(),
		BeforePush: func(step int64) {
			switch {
			case step != stopAt:
			case gentle:
				stopNow()
			default:
				cancel()
			}
		}}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if gentle {
		err = w.RunStoppable(ctx, stop)
	} else {
		err = w.Run(ctx)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the worker did not stop")
	}
	return fakes, err
}
