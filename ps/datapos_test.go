package ps

import (
	"context"
	"math"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

// A worker's data position counts the gradients the parameters hold:
// counted into a completed sync step (not while the step waits), never
// stale, duplicate or after the end.
func TestSyncDataPositions(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 3, MaxVersion: 3}, 1)
	want := func(pos ...int64) {
		t.Helper()
		if got := s.DataPositions(); !slices.Equal(got, pos) {
			t.Fatalf("data positions %v, want %v", got, pos)
		}
		for w, p := range pos {
			if s.DataPosition(w) != p {
				t.Fatalf("DataPosition(%d) = %d, DataPositions says %d", w, s.DataPosition(w), p)
			}
		}
	}
	s.Push(0, 0, grad(1))
	want(0, 0, 0) // waiting in the step: not in the parameters yet
	s.Push(0, 0, grad(1))
	want(0, 0, 0) // a duplicate
	s.Push(1, 0, grad(1))
	want(1, 1, 0)
	s.Push(2, 0, grad(1)) // the backup worker's gradient is stale
	want(1, 1, 0)
	// A step completed by a membership change counts what it holds.
	s.Push(2, 1, grad(1))
	want(1, 1, 0)
	if !s.SetLive([]int{2}) {
		t.Fatal("the pending step did not complete")
	}
	want(1, 1, 1)
	s.SetLive([]int{0, 1, 2})
	s.Push(0, 2, grad(1))
	s.Push(1, 2, grad(1))
	if !s.Done() {
		t.Fatal("not done at the last version")
	}
	want(2, 2, 1)
	s.Push(2, 3, grad(1)) // after the end
	want(2, 2, 1)
}

// In async/ssp every applied gradient counts, stale ones included; the
// ssp clock of a worker coming back to life jumps to the slowest live
// worker's, its data position does not (it would skip batches).
func TestAsyncAndSSPDataPositions(t *testing.T) {
	a := newTestShard(t, ShardConfig{Mode: config.Async, Workers: 2}, 1)
	a.Push(0, 0, grad(1))
	a.Push(1, 0, grad(1)) // stale by one, applied
	a.Push(1, 2, grad(1))
	if got := a.DataPositions(); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("async positions %v, want [1 2]", got)
	}
	s := newTestShard(t, ShardConfig{Mode: config.SSP, Staleness: 5, Workers: 2}, 1)
	s.SetLive([]int{0})
	for v := range int64(4) {
		s.Push(0, v, grad(1))
	}
	s.SetLive([]int{0, 1})
	if s.Clock(1) != 4 {
		t.Fatalf("ssp clock of the returning worker %d, want 4", s.Clock(1))
	}
	if got := s.DataPositions(); !slices.Equal(got, []int64{4, 0}) {
		t.Fatalf("ssp positions %v, want [4 0]", got)
	}
}

// A push that says which batch it is moves the position to one past that
// batch once it is in the parameters, whatever the shard dropped before:
// with backup workers two shards drop different gradients, and both still
// agree on where each worker is.
func TestPushAtTracksTheFurthestBatch(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 3}, 1)
	want := func(pos ...int64) {
		t.Helper()
		if got := s.DataPositions(); !slices.Equal(got, pos) {
			t.Fatalf("data positions %v, want %v", got, pos)
		}
	}
	s.PushAt(0, 0, grad(1), 1)
	s.PushAt(1, 0, grad(1), 1)
	want(1, 1, 0)
	s.PushAt(2, 0, grad(1), 1) // stale: worker 2 will take its batch 0 again
	want(1, 1, 0)
	// Worker 0's batch 1 is dropped here (counted on another shard), so
	// its next gradient is of batch 2.
	s.PushAt(1, 1, grad(1), 2)
	s.PushAt(2, 1, grad(1), 1)
	want(1, 2, 1)
	s.PushAt(0, 2, grad(1), 3)
	want(1, 2, 1) // waiting in the step
	s.PushAt(2, 2, grad(1), 2)
	want(3, 2, 2)
	// An older batch (a worker rolled back) never moves it back.
	s.PushAt(0, 3, grad(1), 1)
	s.PushAt(1, 3, grad(1), 3)
	want(3, 3, 2)
	a := newTestShard(t, ShardConfig{Mode: config.Async, Workers: 1}, 1)
	a.PushAt(0, 0, grad(1), 5)
	a.Drop(0, 0, 6)
	a.Drop(0, 0, 0)
	if got := a.DataPosition(0); got != 7 {
		t.Fatalf("async position %d, want 7", got)
	}
}

func TestSetDataPositions(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}, 1)
	if err := s.SetDataPositions([]int64{1}); err == nil {
		t.Fatal("one position for two workers accepted")
	}
	if err := s.SetDataPositions([]int64{1, -1}); err == nil {
		t.Fatal("a negative position accepted")
	}
	if err := s.SetDataPositions([]int64{10, 20}); err != nil {
		t.Fatal(err)
	}
	s.Push(0, 0, grad(1))
	s.Push(1, 0, grad(1))
	if got := s.DataPositions(); !slices.Equal(got, []int64{11, 21}) {
		t.Fatalf("positions %v, want [11 21]", got)
	}
}

// initWith re-initialises srv (shard 0 of 1, two sync workers) with the
// given data positions in generation gen.
func initWith(srv *Server, n int, gen int64, positions []int64) error {
	return initSlots(srv, n, gen, positions, 0)
}

// initSlots is initWith as the chief of an elastic run sends it: slots is
// InitRequest.data_slots.
func initSlots(srv *Server, n int, gen int64, positions []int64, slots int32) error {
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	r := config.Default()
	r.LRSchedule = "constant" // the update rule under test, not the schedule
	r.Workers, r.PS, r.Optimizer = 2, 1, "momentum"
	_, err := srv.Init(context.Background(), &pb.InitRequest{RunId: "r", Shard: 0, NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
		Params: wire.Bytes(make([]float32, n)), Generation: gen, ModelSpec: convert.ModelSpec(spec), DataPositions: positions,
		StepsPerEpoch: 100, DataSlots: slots}) // as the chief sends it (a step schedule needs it)
	return err
}

// Init sets the positions, a worker's pull carries its own, a checkpoint
// records them all.
func TestServerDataPositions(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	if err := initWith(srv, n, 2, []int64{5, 7}); err != nil {
		t.Fatal(err)
	}
	pullPos := func(worker int32) int64 {
		t.Helper()
		resp, err := srv.Pull(ctx, &pb.PullRequest{Worker: worker, RunId: "r"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.DataPosition
	}
	if p0, p1, chief := pullPos(0), pullPos(1), pullPos(-1); p0 != 5 || p1 != 7 || chief != 0 {
		t.Fatalf("pulled positions %d %d (chief %d), want 5 7 0", p0, p1, chief)
	}
	push(t, srv, 0, 0, 2, n)
	push(t, srv, 1, 0, 2, n)
	if p1 := pullPos(1); p1 != 8 {
		t.Fatalf("worker 1 at %d after a step, want 8", p1)
	}
	resp, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 1, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.DataPositions, []int64{6, 8}) {
		t.Fatalf("checkpoint positions %v, want [6 8]", resp.DataPositions)
	}
	// Pushes that say which batch they are (as workers' do).
	for w, after := range []int64{20, 9} {
		if _, err := srv.Push(ctx, &pb.PushRequest{Worker: int32(w), Version: 1, Grad: wire.Bytes(make([]float32, n)),
			RunId: "r", Generation: 2, DataPosition: after}); err != nil {
			t.Fatal(err)
		}
	}
	if p0, p1 := pullPos(0), pullPos(1); p0 != 20 || p1 != 9 {
		t.Fatalf("positions %d %d after pushes of batches 19 and 8, want 20 9", p0, p1)
	}
	// Positions for another number of workers are ignored; negative ones
	// refused.
	if err := initWith(srv, n, 3, []int64{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if p1 := pullPos(1); p1 != 0 {
		t.Fatalf("worker 1 at %d after positions for 3 workers, want 0", p1)
	}
	if err := initWith(srv, n, 4, []int64{1, -2}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("negative position: %v, want InvalidArgument", err)
	}
}

// Under --nan-policy skip a dropped non-finite gradient uses up its batch
// in every mode, so a worker never computes a batch that gives NaN again
// and again.
func TestNaNSkipUsesUpTheBatch(t *testing.T) {
	for _, mode := range []config.Mode{config.Sync, config.Async} {
		t.Run(string(mode), func(t *testing.T) {
			srv, _, n := newTestServer(t, 1, func(r *config.Run) {
				r.Workers, r.PS, r.Mode, r.NaNPolicy = 1, 1, mode, config.Skip
			})
			g := make([]float32, n)
			g[0] = float32(math.Inf(1))
			resp, err := srv.Push(context.Background(), &pb.PushRequest{Worker: 0, Grad: wire.Bytes(g), RunId: "r", Generation: 1})
			if err != nil || resp.Outcome != pb.PushResponse_STALE {
				t.Fatalf("skipped push: %v %v", resp, err)
			}
			pr, err := srv.Pull(context.Background(), &pb.PullRequest{Worker: 0, RunId: "r"})
			if err != nil || pr.DataPosition != 1 {
				t.Fatalf("data position after a skipped gradient: %v %v, want 1", pr.GetDataPosition(), err)
			}
		})
	}
}

// A shard restored from a checkpoint of an elastic run keeps the data
// positions of every worker that had joined, however many there were
// against --workers (2 here): 3 after a scale-up, or 2 from a checkpoint
// older than a scale-up to 4 (the new workers then start at 0).
func TestElasticRunKeepsDataPositions(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	positions := func() []int64 {
		t.Helper()
		resp, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 1, RunId: "r"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.DataPositions
	}
	if err := initSlots(srv, n, 2, []int64{2, 4, 1}, 3); err != nil {
		t.Fatal(err)
	}
	if got := positions(); !slices.Equal(got, []int64{2, 4, 1}) {
		t.Fatalf("positions %v after a restore of 3 workers' positions, want [2 4 1]", got)
	}
	if err := initSlots(srv, n, 3, []int64{6, 5}, 4); err != nil {
		t.Fatal(err)
	}
	if got := positions(); len(got) < 2 || got[0] != 6 || got[1] != 5 || slices.ContainsFunc(got[2:], func(p int64) bool { return p != 0 }) {
		t.Fatalf("positions %v after a restore of an older checkpoint's [6 5], want [6 5] and zeros", got)
	}
	// Without data_slots (a run that never scaled), 3 positions for 2
	// workers are of a run cut differently: ignored.
	if err := initSlots(srv, n, 4, []int64{1, 2, 3}, 0); err != nil {
		t.Fatal(err)
	}
	if got := positions(); slices.ContainsFunc(got, func(p int64) bool { return p != 0 }) {
		t.Fatalf("positions %v for another number of workers were used", got)
	}
}
