package ps

import (
	"context"
	"slices"
	"testing"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
)

// syncStep has both workers of a newSyncServer push for version v.
func syncStep(t *testing.T, srv *Server, v, gen int64, n int) {
	t.Helper()
	push(t, srv, 0, v, gen, n)
	if got := push(t, srv, 1, v, gen, n).Version; got != v+1 {
		t.Fatalf("version %d after a step from %d", got, v)
	}
}

// readShardFile commits a one-shard manifest for resp and reads the
// file back: parameters, optimizer state and optimizer steps.
func readShardFile(t *testing.T, store *checkpoint.Store, step int64, resp *pb.CheckpointResponse) ([]float32, []float32, int64) {
	t.Helper()
	m := checkpoint.Manifest{Step: step, Version: resp.Version, Mode: "sync", Shards: []checkpoint.ShardInfo{{Index: 0, File: resp.File,
		SHA256: resp.Sha256, Bytes: resp.Bytes, Tensors: resp.Tensors, Version: resp.Version}}}
	if err := store.Commit(m); err != nil {
		t.Fatal(err)
	}
	ck, err := store.Load(store.Path(step))
	if err != nil {
		t.Fatal(err)
	}
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	st, err := shardckpt.Read(ck, spec, "momentum")
	if err != nil {
		t.Fatal(err)
	}
	plan, _ := partition.New(spec, 1)
	p, o := st.Shard(plan, 0)
	return p, o, st.OptimizerSteps
}

// The chief's evaluation pull with retain set keeps that version's state;
// a checkpoint with retained set writes it, however far training has gone
// since; a later retain replaces it and Init forgets it.
func TestRetainedCheckpointIsTheEvaluatedState(t *testing.T) {
	srv, store, n := newSyncServer(t, 1)
	ctx := context.Background()
	if _, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 1, Retained: true, RunId: "r"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("retained checkpoint with nothing retained: %v, want FailedPrecondition", err)
	}
	syncStep(t, srv, 0, 1, n)
	syncStep(t, srv, 1, 1, n)
	wantParams, wantOpt := retainVersion2(t, srv)
	syncStep(t, srv, 2, 1, n)
	syncStep(t, srv, 3, 1, n)
	checkRetainedAndLive(t, srv, store, wantParams, wantOpt)
	checkRetainReplaced(t, srv, store, n)

	// Init (a rollback, or a restored PS) forgets it.
	if err := initWith(srv, n, 2, nil); err != nil {
		t.Fatal(err)
	}
	_, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 14, Retained: true, RunId: "r"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("retained checkpoint after Init: %v, want FailedPrecondition", err)
	}
	t.Logf("after Init: %v", err)
}

// retainVersion2 is the chief's evaluation pull, over gRPC, of a shard at
// version 2; it returns the state retained: parameters and momentum.
func retainVersion2(t *testing.T, srv *Server) (params, opt []float32) {
	t.Helper()
	resp, err := srv.Pull(context.Background(), &pb.PullRequest{Worker: -1, RunId: "r", Retain: true})
	if err != nil || resp.Version != 2 {
		t.Fatalf("retaining pull: version %v, %v", resp.GetVersion(), err)
	}
	v, params, opt, steps, _ := srv.Snapshot()
	if v != 2 || steps != 2 || !slices.ContainsFunc(opt, func(x float32) bool { return x != 0 }) {
		t.Fatalf("state at version 2: version %d, %d optimizer steps, momentum %v", v, steps, opt)
	}
	return params, opt
}

// checkRetainedAndLive checks, on a shard at version 4 that retained
// version 2 (wantParams, wantOpt), that a retained checkpoint writes
// version 2's state, a normal one the live state, and a retained one of
// another version is refused.
func checkRetainedAndLive(t *testing.T, srv *Server, store *checkpoint.Store, wantParams, wantOpt []float32) {
	t.Helper()
	ctx := context.Background()
	ck, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 10, Retained: true, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Version != 2 || !slices.Equal(ck.DataPositions, []int64{2, 2}) {
		t.Fatalf("retained checkpoint: version %d positions %v, want 2 and [2 2]", ck.Version, ck.DataPositions)
	}
	params, opt, steps := readShardFile(t, store, 10, ck)
	if !slices.Equal(params, wantParams) || !slices.Equal(opt, wantOpt) || steps != 2 {
		t.Fatalf("the retained checkpoint does not hold version 2's state (optimizer steps %d)", steps)
	}
	// The live state moved on and a normal checkpoint still writes it.
	live, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 11, RunId: "r"})
	if err != nil || live.Version != 4 || !slices.Equal(live.DataPositions, []int64{4, 4}) {
		t.Fatalf("live checkpoint: %v %v", live, err)
	}
	if p, _, _ := readShardFile(t, store, 11, live); slices.Equal(p, wantParams) {
		t.Fatal("the live checkpoint holds the retained parameters")
	}
	if _, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 12, AtVersion: 3, Retained: true, RunId: "r"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("retained checkpoint of another version: %v, want FailedPrecondition", err)
	}
}

// checkRetainReplaced retains version 4 over the data plane's path (the
// shard is there), steps on, and checks a retained checkpoint holds
// version 4.
func checkRetainReplaced(t *testing.T, srv *Server, store *checkpoint.Store, n int) {
	t.Helper()
	ctx := context.Background()
	sresp, release, err := srv.PullShared(ctx, &pb.PullRequest{Worker: -1, RunId: "r", Retain: true})
	if err != nil || sresp.Version != 4 {
		t.Fatalf("retaining shared pull: %v", err)
	}
	release()
	_, want4, _, _, _ := srv.Snapshot()
	syncStep(t, srv, 4, 1, n)
	ck, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 13, AtVersion: 4, Retained: true, RunId: "r"})
	if err != nil || ck.Version != 4 {
		t.Fatalf("second retained checkpoint: %v %v", ck, err)
	}
	if p, _, _ := readShardFile(t, store, 13, ck); !slices.Equal(p, want4) {
		t.Fatal("the second retained checkpoint does not hold version 4's parameters")
	}
}

// Retaining holds a pull snapshot instead of copying it; with retains
// between steps the pull snapshots still reach a steady state (no new
// buffer per step), and no hold is left behind.
func TestRetainKeepsPullSnapshotsInSteadyState(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	seen := map[*byte]int{} // snapshot buffer -> first step seen
	pull := func(worker int32, retain bool, v int64) {
		t.Helper()
		resp, release, err := srv.PullShared(ctx, &pb.PullRequest{Worker: worker, MinVersion: v, RunId: "r", Retain: retain})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := seen[unsafe.SliceData(resp.Params)]; !ok {
			seen[unsafe.SliceData(resp.Params)] = int(v)
		}
		release()
	}
	const steps = 60
	for v := int64(0); v < steps; v++ {
		pull(0, false, v)
		pull(1, false, v)
		if v%3 == 0 {
			pull(-1, true, v)
		}
		syncStep(t, srv, v, 1, n)
	}
	late := 0
	for _, first := range seen {
		if first >= 10 {
			late++
		}
	}
	if len(seen) > 3 || late > 0 {
		t.Fatalf("%d snapshot buffers over %d steps, %d of them new after step 10: the retained snapshot leaks buffers", len(seen), steps, late)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	r := srv.retained
	if r == nil || r.version != steps-3 || r.held.readers != 1 || r.writers != 0 {
		t.Fatalf("retained state: %+v", r)
	}
	if srv.snap != nil && srv.snap != r.held && srv.snap.readers != 0 {
		t.Fatalf("the current snapshot has %d holders, want none", srv.snap.readers)
	}
	t.Logf("%d snapshot buffers over %d steps with a retain every 3", len(seen), steps)
}

// A retain while a retained checkpoint is being written leaves the
// writer's buffers alone.
func TestRetainDuringRetainedCheckpoint(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	syncStep(t, srv, 0, 1, n)
	if _, err := srv.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r", Retain: true}); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	r, err := srv.holdRetained(0) // as Checkpoint does
	srv.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	opt, params := slices.Clone(r.opt), slices.Clone(r.params)
	syncStep(t, srv, 1, 1, n)
	if _, err := srv.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r", Retain: true}); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	if srv.retained == r || srv.retained.version != 2 {
		t.Error("the retain reused the state a checkpoint is writing")
	}
	if !slices.Equal(r.opt, opt) || !slices.Equal(r.params, params) || r.version != 1 {
		t.Error("the state a checkpoint is writing changed")
	}
	srv.mu.Unlock()
	srv.releaseRetained(r)
	srv.release(r.held)
	// The next retain reuses the current retained state's buffers.
	srv.mu.Lock()
	cur := srv.retained
	srv.mu.Unlock()
	syncStep(t, srv, 2, 1, n)
	if _, err := srv.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r", Retain: true}); err != nil {
		t.Fatal(err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.retained != cur || cur.version != 3 {
		t.Error("a retain with no checkpoint writing did not reuse the retained state")
	}
}

// A chief's evaluation pull without retain drops the state an earlier
// one kept (a CTR shard's kept state holds its tables' frozen slots) and
// still closes the attribution window.
func TestEvaluationWithoutRetainDropsTheRetainedState(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	syncStep(t, srv, 0, 1, n)
	syncStep(t, srv, 1, 1, n)
	retainVersion2(t, srv)
	syncStep(t, srv, 2, 1, n)
	resp, err := srv.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r"})
	if err != nil || resp.Version != 3 {
		t.Fatalf("evaluation pull: version %v, %v", resp.GetVersion(), err)
	}
	if _, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 5, Retained: true, RunId: "r"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("retained checkpoint after an evaluation without retain: %v, want FailedPrecondition", err)
	}
	if st, err := srv.Status(ctx, &pb.StatusRequest{}); err != nil || st.WindowTo != 3 {
		t.Fatalf("the evaluation pull at version 3 left the window ending at %d (%v), want 3", st.GetWindowTo(), err)
	}
}
