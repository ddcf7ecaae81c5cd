package worker_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/transport/wire"
	"github.com/pstrain/pstrain/worker"
)

// The tests here order a one-worker sync run's answers so that shard 1
// (the first layer's later rows and the layers above) answers each pull
// before shard 0, which waits until the worker has loaded the step's
// batch ahead: the worker then starts the step's forward pass from shard
// 1's rows (head_start.go), and the gradients it pushes must be the ones a
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
	lag    map[int64]bool // the first answer at a version in it says the version before (once)
	region []float32      // viewShard's answers (see there)

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
	said := v
	if s.lag[v] {
		delete(s.lag, v)
		said = v - 1
	}
	s.mu.Unlock()
	done := v >= s.last
	if s.gate != nil && v > 0 && !done {
		s.gate(pos)
	}
	return &pb.PullResponse{Version: said, Generation: 1, Done: done, Params: wire.Bytes(slices.Clone(s.params)),
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

// viewShard is an aheadShard whose pulls answer in a region, as a
// same-host PS does (worker.ViewingDataPlane): Params is a view of one
// buffer that every request first scribbles over (the PS writes the
// region only to answer a request; here it garbles it, so a worker that
// reads the parameters of an earlier answer after it sent another
// request computes on garbage).
type viewShard struct{ *aheadShard }

func (s viewShard) PullView(ctx context.Context, in *pb.PullRequest, _ [][]float32) (*pb.PullResponse, error) {
	s.scribble()
	resp, err := s.Pull(ctx, in)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	copy(s.region, s.params)
	resp.Params = wire.Bytes(s.region)
	return resp, nil
}

func (s viewShard) Push(ctx context.Context, in *pb.PushRequest, opts ...grpc.CallOption) (*pb.PushResponse, error) {
	s.scribble()
	return s.aheadShard.Push(ctx, in, opts...)
}

func (s viewShard) scribble() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.region {
		s.region[i] = 7
	}
}

// aheadOpts shape runAhead's run.
type aheadOpts struct {
	steps   int64
	move    map[int64]int64 // shard 0's moved positions (aheadShard.move)
	lag     map[int64]bool  // shard 0's lagging answers (aheadShard.lag)
	view    bool            // the shards answer in regions (viewShard)
	start   [2]int64        // the shards' versions (and the worker's data positions) at the start
	ungated bool            // shard 0 does not wait for the batch loaded ahead
}

// aheadRun is what runAhead leaves for the checks.
type aheadRun struct {
	w      *worker.Worker
	shards [2]*aheadShard
	plan   partition.Plan
	params [][]float32 // the shards' parameters, whole
	data   *dataset.Dataset
	// The net's own parameter memory (nn.Net.Params): before the run,
	// whether a pull wrote it (seen after each step's pulls), and after
	// the run.
	before, after [][]float32
	written       bool
}

// runAhead runs the worker for o.steps steps against the two shards,
// shard 0 answering each step's pull (but the first) once the worker has
// taken the batch shard 1's answer names, unless o.ungated.
func runAhead(t *testing.T, o aheadOpts) aheadRun {
	t.Helper()
	spec := model.Spec{Input: 8, Hidden: []int{6}, Classes: 3}
	plan, err := partition.New(spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	if b := plan.Shards[1].Blocks[0]; b.Var != 0 || b.RowStart == 0 {
		t.Fatalf("shard 1 starts with %+v: the test needs it to hold the first layer's later rows", b)
	}
	r := aheadRun{plan: plan, params: spec.Init(3), data: testcluster.Synthetic(40, spec.Input, spec.Classes, 1)}
	src := newTakenSource(slice{d: r.data, m: 1, b: 2})
	var conns []worker.Shard
	for s := range r.shards {
		flat := make([]float32, plan.Shards[s].Size)
		plan.Gather(s, r.params, flat)
		sh := &aheadShard{params: flat, last: o.steps, changed: make(chan struct{}), region: make([]float32, len(flat)),
			version: o.start[s], pos: o.start[s]}
		r.shards[s] = sh
		var dp worker.DataPlane = sh
		if o.view {
			dp = viewShard{sh}
		}
		conns = append(conns, worker.Shard{Addr: fmt.Sprintf("fake/%d", s), Client: dp, Puller: dp})
	}
	r.shards[0].move, r.shards[0].lag = o.move, o.lag
	if !o.ungated {
		r.shards[0].gate = src.waitTaken
	}
	net, err := nn.New(spec, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	for _, p := range net.Params() {
		r.before = append(r.before, slices.Clone(p))
	}
	run := config.Default()
	run.Mode, run.PS, run.Workers, run.Batch, run.Hidden = config.Sync, 2, 1, 2, spec.Hidden
	afterPull := func(int64) {
		for v, p := range net.Params() {
			r.written = r.written || !slices.Equal(p, r.before[v])
		}
	}
	r.w, err = worker.New(worker.Config{Index: 0, RunID: "r", Run: run, Plan: plan, Net: net, Shards: conns,
		Batches: src, Log: quietLog(), CatchUpAfter: 50 * time.Millisecond, AfterPull: afterPull})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range net.Params() {
		r.after = append(r.after, slices.Clone(p))
	}
	return r
}

// checkAheadPushes checks that every push to each shard carried the
// gradient a net computes from scratch on the shards' parameters and the
// batch at the push's data position - 1, and that the pushes were tagged
// with versions and data positions as want says: "v@p ..." by shard.
func checkAheadPushes(t *testing.T, r aheadRun, want [2]string) {
	t.Helper()
	spec := model.Spec{Input: 8, Hidden: []int{6}, Classes: 3}
	ref, err := nn.New(spec, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	// The same row blocks as the worker's net (its plan's), so the
	// sums are added in the same order.
	if !ref.SetEarlyRows([]int{r.plan.Shards[1].Blocks[0].RowStart}, func(int, float32) {}) {
		t.Fatal("the reference net refused early rows")
	}
	labels := make([]uint8, 2)
	for s, sh := range r.shards {
		var got []string
		for i, p := range sh.pushes {
			got = append(got, fmt.Sprintf("%d@%d", p.version, p.pos))
			for v, w := range r.params {
				copy(ref.Params()[v], w)
			}
			src := slice{d: r.data, m: 1, b: 2}
			src.SeekBatch(p.pos - 1)
			grads := gradsOn(t, ref, &src, labels)
			g := make([]float32, r.plan.Shards[s].Size)
			r.plan.Gather(s, grads, g)
			if !slices.Equal(p.grad, g) {
				t.Fatalf("shard %d, push %d (batch %d): pushed %v, a step from scratch gives %v", s, i, p.pos-1, p.grad, g)
			}
		}
		if g := strings.Join(got, " "); g != want[s] {
			t.Fatalf("shard %d: pushes (version@data position) %s, want %s", s, g, want[s])
		}
	}
}

// Shard 1 answers first each step: the worker starts every step but the
// first (its data position is not known before the first answers) ahead,
// and pushes what a step from scratch computes; so does a worker reading
// its parameters where the pulls leave them, whose own weights are then
// never written.
func TestStepStartsAheadOnTheFirstAnswer(t *testing.T) {
	bothWays(t, func(t *testing.T, view bool) {
		r := runAhead(t, aheadOpts{steps: 6, view: view})
		if got := r.w.AheadSteps(); got != 5 {
			t.Fatalf("%d of 6 steps started ahead, want 5", got)
		}
		all := "0@1 1@2 2@3 3@4 4@5 5@6"
		checkAheadPushes(t, r, [2]string{all, all})
		// The net's own weights: written by the pulls without
		// in-place reads, never with them; after the run they hold
		// the last answers either way (the net reads them again).
		if slices.Equal(r.before[0], r.params[0]) {
			t.Fatal("the net's weights start as the shards' parameters: the checks below could not fail")
		}
		if r.written != !view {
			t.Fatalf("in place %v: the pulls wrote the net's weights: %v", view, r.written)
		}
		for v := range r.after {
			if !slices.Equal(r.after[v], r.params[v]) {
				t.Fatalf("in place %v: after the run, variable %d of the net's weights is not the shards'", view, v)
			}
		}
	})
}

// Shard 0 answers step 3 with a data position 2 further on (as after a
// rollback): what the worker computed ahead on the batch shard 1 named
// is dropped, the step trains on the batch at the moved position, and
// the steps after it start ahead again.
func TestStepAheadOnAMovedPositionIsDropped(t *testing.T) {
	bothWays(t, func(t *testing.T, view bool) {
		r := runAhead(t, aheadOpts{steps: 6, move: map[int64]int64{3: 2}, view: view})
		if got := r.w.AheadSteps(); got != 4 {
			t.Fatalf("%d of 6 steps started ahead, want 4 (all but the first and the moved one)", got)
		}
		all := "0@1 1@2 2@3 3@6 4@7 5@8"
		checkAheadPushes(t, r, [2]string{all, all})
	})
}

// Shard 0 answers step 3's first pull a version behind (after the worker
// loaded the batch and computed ahead on shard 1's answer): ps.Align asks
// for another round, so what was computed ahead is dropped although the
// batch is the step's, and the data source goes back for the step to
// load it again.
func TestStepAheadDroppedWhenAShardLags(t *testing.T) {
	bothWays(t, func(t *testing.T, view bool) {
		r := runAhead(t, aheadOpts{steps: 6, lag: map[int64]bool{3: true}, view: view})
		if got := r.w.AheadSteps(); got != 4 {
			t.Fatalf("%d of 6 steps started ahead, want 4 (all but the first and the lagging one)", got)
		}
		all := "0@1 1@2 2@3 3@4 4@5 5@6"
		checkAheadPushes(t, r, [2]string{all, all})
	})
}

// The worker starts (as a new incarnation of one that died between its
// pushes) with shard 0 a step behind shard 1: the bounded pull that waits
// for shard 0 stalls, and the worker pushes it a catch-up gradient
// computed on the parameters it has. With views, that pull is a request
// on shard 0's connection, which may rewrite its region (here it always
// does): the worker copies the parameters into its weights before, and
// the catch-up gradient is the right one.
func TestViewsSurviveACatchUp(t *testing.T) {
	bothWays(t, func(t *testing.T, view bool) {
		r := runAhead(t, aheadOpts{steps: 5, view: view, start: [2]int64{2, 3}, ungated: true})
		// The catch-up (2@4) trains on batch 3, the one after the
		// furthest a shard holds; shard 1 gets none.
		checkAheadPushes(t, r, [2]string{"2@4 3@5 4@6", "3@5 4@6"})
	})
}

// bothWays runs f as a subtest without and with in-place reads
// (viewShard).
func bothWays(t *testing.T, f func(t *testing.T, view bool)) {
	for _, view := range []bool{false, true} {
		t.Run(fmt.Sprintf("view=%v", view), func(t *testing.T) { f(t, view) })
	}
}
