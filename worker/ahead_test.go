package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/inproc"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
	"github.com/pstrain/pstrain/worker"
)

// The tests here order a one-worker sync run's answers so that shard 1
// (the first layer's later rows and the layers above) answers each pull
// before shard 0, which waits until the worker has loaded the step's
// batch ahead: the worker then starts the step's forward pass from shard
// 1's rows (ahead.go), and the gradients it pushes must be the ones a
// step computed from scratch gives, bit for bit.

// takenSource is a batch source that says which positions it was asked
// for.
type takenSource struct {
	slice
	mu      sync.Mutex
	changed chan struct{}
	taken   map[int64]bool
}

func newTakenSource(s slice) *takenSource {
	return &takenSource{slice: s, changed: make(chan struct{}), taken: map[int64]bool{}}
}

func (s *takenSource) Next(x []float32, y []uint8) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.taken[int64(s.t)] = true
	s.slice.Next(x, y)
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *takenSource) SeekBatch(p int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.slice.SeekBatch(p)
}

// waitTaken waits (up to a second) until position p has been taken.
func (s *takenSource) waitTaken(p int64) {
	deadline := time.After(time.Second)
	for {
		s.mu.Lock()
		ok, ch := s.taken[p], s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			return
		}
	}
}

// aheadShard is one shard of the run: a pull waits for its MinVersion,
// then (with gate) for the gate, and answers with the shard's fixed
// parameters and the data position of the last push it counted (plus
// move[version], a position moved as by a rollback); a push tagged with
// the current version completes the step. It records every push.
type aheadShard struct {
	params []float32
	last   int64
	gate   func(pos int64) // nil: none
	move   map[int64]int64

	mu      sync.Mutex
	changed chan struct{}
	version int64
	pos     int64
	pushes  []aheadPush
}

type aheadPush struct {
	version, pos int64
	grad         []float32
}

func (s *aheadShard) Pull(ctx context.Context, in *pb.PullRequest, _ ...grpc.CallOption) (*pb.PullResponse, error) {
	s.mu.Lock()
	for s.version < in.MinVersion && s.version < s.last {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
	v, pos := s.version, s.pos
	s.mu.Unlock()
	done := v >= s.last
	if s.gate != nil && v > 0 && !done {
		s.gate(pos)
	}
	return &pb.PullResponse{Version: v, Generation: 1, Done: done, Params: wire.Bytes(slices.Clone(s.params)),
		DataPosition: pos + s.move[v]}, nil
}

func (s *aheadShard) Push(ctx context.Context, in *pb.PushRequest, _ ...grpc.CallOption) (*pb.PushResponse, error) {
	g, err := wire.Floats(in.Grad)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pushes = append(s.pushes, aheadPush{version: in.Version, pos: in.DataPosition, grad: slices.Clone(g)})
	if in.Version == s.version {
		s.version++
		s.pos = in.DataPosition
		close(s.changed)
		s.changed = make(chan struct{})
	}
	return &pb.PushResponse{}, nil
}

// runAhead runs the worker for steps steps against the two shards, shard
// 0 answering each step's pull (but the first) once the worker has taken
// the batch shard 1's answer names, and returns the worker, the shards
// and what a reference needs.
func runAhead(t *testing.T, steps int64, move map[int64]int64) (*worker.Worker, [2]*aheadShard, partition.Plan, [][]float32, *dataset.Dataset) {
	t.Helper()
	spec := model.Spec{Input: 8, Hidden: []int{6}, Classes: 3}
	plan, err := partition.New(spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	if b := plan.Shards[1].Blocks[0]; b.Var != 0 || b.RowStart == 0 {
		t.Fatalf("shard 1 starts with %+v: the test needs it to hold the first layer's later rows", b)
	}
	params := spec.Init(3)
	data := inproc.Synthetic(40, spec.Input, spec.Classes, 1)
	src := newTakenSource(slice{d: data, m: 1, b: 2})
	var shards [2]*aheadShard
	var conns []worker.Shard
	for s := range shards {
		flat := make([]float32, plan.Shards[s].Size)
		plan.Gather(s, params, flat)
		shards[s] = &aheadShard{params: flat, last: steps, changed: make(chan struct{})}
		conns = append(conns, worker.Shard{Addr: fmt.Sprintf("fake/%d", s), Client: shards[s], Puller: shards[s]})
	}
	shards[0].gate, shards[0].move = src.waitTaken, move
	net, err := nn.New(spec, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	run := config.Default()
	run.Mode, run.PS, run.Workers, run.Batch, run.Hidden = config.Sync, 2, 1, 2, spec.Hidden
	w, err := worker.New(worker.Config{Index: 0, RunID: "r", Run: run, Plan: plan, Net: net, Shards: conns,
		Batches: src, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	return w, shards, plan, params, data
}

// checkAheadPushes checks that each step pushed both shards, in order,
// the gradient a net computes from scratch on the shards' parameters
// and the batch at the push's data position - 1, and that the positions
// are want.
func checkAheadPushes(t *testing.T, shards [2]*aheadShard, plan partition.Plan, params [][]float32, data *dataset.Dataset, want []int64) {
	t.Helper()
	spec := model.Spec{Input: 8, Hidden: []int{6}, Classes: 3}
	ref, err := nn.New(spec, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	// The same row blocks as the worker's net (its plan's), so the
	// sums are added in the same order.
	if !ref.SetEarlyRows([]int{plan.Shards[1].Blocks[0].RowStart}, func(int, float32) {}) {
		t.Fatal("the reference net refused early rows")
	}
	labels := make([]uint8, 2)
	for s, sh := range shards {
		var got []int64
		for i, p := range sh.pushes {
			got = append(got, p.pos)
			if p.version != int64(i) {
				t.Fatalf("shard %d: push %d tagged version %d", s, i, p.version)
			}
			for v, w := range params {
				copy(ref.Params()[v], w)
			}
			src := slice{d: data, m: 1, b: 2}
			src.SeekBatch(p.pos - 1)
			src.Next(ref.Input(), labels)
			ref.SetLabels(labels)
			if _, err := ref.Step(); err != nil {
				t.Fatal(err)
			}
			grads, err := ref.Grads()
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float32, plan.Shards[s].Size)
			plan.Gather(s, grads, want)
			if !slices.Equal(p.grad, want) {
				t.Fatalf("shard %d, step %d (batch %d): pushed %v, a step from scratch gives %v", s, i, p.pos-1, p.grad, want)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("shard %d: pushes at data positions %v, want %v", s, got, want)
		}
	}
}

// Shard 1 answers first each step: the worker starts every step but the
// first (its data position is not known before the first answers) ahead,
// and pushes what a step from scratch computes.
func TestStepStartsAheadOnTheFirstAnswer(t *testing.T) {
	w, shards, plan, params, data := runAhead(t, 6, nil)
	if got := w.AheadSteps(); got != 5 {
		t.Fatalf("%d of 6 steps started ahead, want 5", got)
	}
	checkAheadPushes(t, shards, plan, params, data, []int64{1, 2, 3, 4, 5, 6})
}

// Shard 0 answers step 3 with a data position 2 further on (as after a
// rollback): what the worker computed ahead on the batch shard 1 named
// is dropped, the step trains on the batch at the moved position, and
// the steps after it start ahead again.
func TestStepAheadOnAMovedPositionIsDropped(t *testing.T) {
	w, shards, plan, params, data := runAhead(t, 6, map[int64]int64{3: 2})
	if got := w.AheadSteps(); got != 4 {
		t.Fatalf("%d of 6 steps started ahead, want 4 (all but the first and the moved one)", got)
	}
	checkAheadPushes(t, shards, plan, params, data, []int64{1, 2, 3, 6, 7, 8})
}
