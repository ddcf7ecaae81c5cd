package ps

import (
	"context"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

// newSyncServer returns a server holding shard 0 of 1 of a small model in
// sync mode with two workers, in generation gen, writing checkpoints to an
// in-memory store.
func newSyncServer(t *testing.T, gen int64) (*Server, *checkpoint.Store, int) {
	t.Helper()
	return newTestServer(t, gen, func(r *config.Run) { r.Workers, r.PS, r.Optimizer = 2, 1, "momentum" })
}

// newTestServer is newSyncServer with the run configuration set by tweak.
func newTestServer(t *testing.T, gen int64, tweak func(*config.Run)) (*Server, *checkpoint.Store, int) {
	t.Helper()
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, err := partition.New(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := config.Default()
	r.LRSchedule = "constant" // the update rule under test, not the schedule
	tweak(&r)
	n := plan.Shards[0].Size
	store := checkpoint.NewStore(checkpoint.NewMemFS(), "/ck", 0)
	srv := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard, Store: store})
	_, err = srv.Init(context.Background(), &pb.InitRequest{RunId: "r", Shard: 0, NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
		Params: wire.Bytes(make([]float32, n)), Generation: gen, ModelSpec: convert.ModelSpec(spec)})
	if err != nil {
		t.Fatal(err)
	}
	return srv, store, n
}

// waitPending waits until k checkpoint requests wait for their version.
func waitPending(t *testing.T, srv *Server, k int) {
	t.Helper()
	for {
		srv.mu.Lock()
		n := len(srv.pending)
		srv.mu.Unlock()
		if n == k {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func push(t *testing.T, srv *Server, worker int32, version, gen int64, n int) *pb.PushResponse {
	t.Helper()
	g := make([]float32, n)
	for i := range g {
		g[i] = 1
	}
	resp, err := srv.Push(context.Background(), &pb.PushRequest{Worker: worker, Version: version, Grad: wire.Bytes(g), RunId: "r", Generation: gen})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// pullShared is worker 0's shared pull of version v of a run "r" at
// generation 1: the answer and its release.
func pullShared(t *testing.T, srv *Server, v int64) (*pb.PullResponse, func()) {
	t.Helper()
	resp, release, err := srv.PullShared(context.Background(), &pb.PullRequest{Worker: 0, MinVersion: v, RunId: "r", Generation: 1})
	if err != nil || resp.Version != v {
		t.Fatalf("pull of version %d: %v %v", v, resp, err)
	}
	return resp, release
}

func TestCheckpointWaitsForItsVersion(t *testing.T) {
	srv, store, n := newSyncServer(t, 1)
	type result struct {
		resp *pb.CheckpointResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := srv.Checkpoint(context.Background(), &pb.CheckpointRequest{Step: 2, AtVersion: 2, RunId: "r"})
		done <- result{resp, err}
	}()
	// Wait until the request is pending, then take two sync steps.
	waitPending(t, srv, 1)
	for v := int64(0); v < 2; v++ {
		push(t, srv, 0, v, 1, n)
		push(t, srv, 1, v, 1, n)
	}
	// The state at version 2 is what the checkpoint must hold.
	_, want, _, _, _ := srv.Snapshot()
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.resp.Version != 2 {
		t.Fatalf("snapshot at version %d, want 2", res.resp.Version)
	}
	// Training went on; the file holds version 2's parameters.
	push(t, srv, 0, 2, 1, n)
	push(t, srv, 1, 2, 1, n)
	m := checkpoint.Manifest{Step: 2, Version: 2, Mode: "sync", Shards: []checkpoint.ShardInfo{{Index: 0, File: res.resp.File,
		SHA256: res.resp.Sha256, Bytes: res.resp.Bytes, Tensors: res.resp.Tensors, Version: 2}}}
	if err := store.Commit(m); err != nil {
		t.Fatal(err)
	}
	ck, err := store.Load(store.Path(2))
	if err != nil {
		t.Fatal(err)
	}
	st, err := shardckpt.Read(ck, model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}, "momentum")
	if err != nil {
		t.Fatal(err)
	}
	plan, _ := partition.New(model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}, 1)
	got, opt := st.Shard(plan, 0)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("param %d: checkpoint %v, state at version 2 %v", i, got[i], want[i])
		}
	}
	if len(opt) != n {
		t.Fatalf("momentum state has %d values, want %d", len(opt), n)
	}
	_, now, _, _, _ := srv.Snapshot()
	if now[0] == want[0] {
		t.Fatal("the shard did not move on after the snapshot")
	}
}

func TestCheckpointTooLateAndAborted(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	push(t, srv, 0, 0, 1, n)
	push(t, srv, 1, 0, 1, n)
	_, err := srv.Checkpoint(context.Background(), &pb.CheckpointRequest{Step: 0, AtVersion: 0, RunId: "r"})
	if err != nil {
		t.Fatalf("a checkpoint now: %v", err)
	}
	if _, err := srv.Checkpoint(context.Background(), &pb.CheckpointRequest{Step: 1, AtVersion: 1, RunId: "r"}); err != nil {
		t.Fatalf("a checkpoint at the current version: %v", err)
	}
	srv.mu.Lock()
	srv.shard.version = 5
	srv.mu.Unlock()
	_, err = srv.Checkpoint(context.Background(), &pb.CheckpointRequest{Step: 3, AtVersion: 3, RunId: "r"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a checkpoint at a passed version: %v, want FailedPrecondition", err)
	}
	// A pending request is aborted when training stops short of it.
	errc := make(chan error, 1)
	go func() {
		_, err := srv.Checkpoint(context.Background(), &pb.CheckpointRequest{Step: 9, AtVersion: 9, RunId: "r"})
		errc <- err
	}()
	waitPending(t, srv, 1)
	if _, err := srv.Stop(context.Background(), &pb.StopRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; status.Code(err) != codes.Aborted {
		t.Fatalf("pending checkpoint after Stop: %v, want Aborted", err)
	}
}

func TestGenerationRollback(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	// A pull waiting for version 1 in generation 1...
	pulled := make(chan *pb.PullResponse, 1)
	go func() {
		resp, err := srv.Pull(context.Background(), &pb.PullRequest{Worker: 0, MinVersion: 1, RunId: "r", Generation: 1})
		if err != nil {
			t.Error(err)
		}
		pulled <- resp
	}()
	// ...returns at once when the chief re-initialises the shard in
	// generation 2 (a rollback), with the new generation's state.
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	r := config.Default()
	r.LRSchedule = "constant" // the update rule under test, not the schedule
	r.Workers, r.PS, r.Optimizer = 2, 1, "momentum"
	if _, err := srv.Init(context.Background(), &pb.InitRequest{RunId: "r", Shard: 0, NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
		Params: wire.Bytes(make([]float32, n)), Generation: 2, ModelSpec: convert.ModelSpec(spec), Version: 0}); err != nil {
		t.Fatal(err)
	}
	select {
	case resp := <-pulled:
		if resp.Generation != 2 || resp.Version != 0 {
			t.Fatalf("pull after rollback: generation %d version %d, want 2 and 0", resp.Generation, resp.Version)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a pull of the old generation stayed blocked after the rollback")
	}
	// A gradient of the old timeline is dropped, one of the new counted.
	if resp := push(t, srv, 0, 0, 1, n); resp.Outcome != pb.PushResponse_STALE {
		t.Fatalf("push from generation 1: %v, want STALE", resp.Outcome)
	}
	st, _ := srv.Status(context.Background(), &pb.StatusRequest{})
	if st.Applied != 0 || st.Generation != 2 {
		t.Fatalf("after an old-generation push: applied %d generation %d, want 0 and 2", st.Applied, st.Generation)
	}
	if resp := push(t, srv, 0, 0, 2, n); resp.Outcome != pb.PushResponse_APPLIED {
		t.Fatalf("push from generation 2: %v, want APPLIED", resp.Outcome)
	}
}

// BenchmarkCheckpointPause measures what a checkpoint costs training: the
// copy under the shard's lock ("pause"), against writing the same shard
// to disk (which happens after the lock is released), for one of two
// shards of the default 784-800-10 model with momentum.
func BenchmarkCheckpointPause(b *testing.B) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	plan, err := partition.New(spec, 2)
	if err != nil {
		b.Fatal(err)
	}
	r := config.Default()
	r.LRSchedule = "constant" // the update rule under test, not the schedule
	n := plan.Shards[0].Size
	srv := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard,
		Store: checkpoint.NewStore(checkpoint.OSFS{}, b.TempDir(), 2)})
	if _, err := srv.Init(context.Background(), &pb.InitRequest{RunId: "r", Shard: 0, NumShards: 2, ShardOptions: OptionsFor(r).Proto(),
		Params: wire.Bytes(make([]float32, n)), Generation: 1, ModelSpec: convert.ModelSpec(spec)}); err != nil {
		b.Fatal(err)
	}
	b.Run("pause", func(b *testing.B) {
		b.SetBytes(int64(8 * n))
		for b.Loop() {
			srv.mu.Lock()
			// As at a new version: the parameters are encoded afresh.
			srv.retire(srv.snap)
			srv.snap = nil
			sn := srv.takeSnapshot()
			srv.unhold(sn.held)
			srv.mu.Unlock()
		}
	})
	b.Run("write", func(b *testing.B) {
		b.SetBytes(int64(8 * n))
		step := int64(0)
		for b.Loop() {
			step++
			if _, err := srv.Checkpoint(context.Background(), &pb.CheckpointRequest{Step: step, RunId: "r"}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestNaNPolicy(t *testing.T) {
	for _, policy := range []config.NaNPolicy{config.Reject, config.Skip} {
		t.Run(string(policy), func(t *testing.T) {
			spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
			plan, _ := partition.New(spec, 1)
			n := plan.Shards[0].Size
			r := config.Default()
			r.LRSchedule = "constant" // the update rule under test, not the schedule
			r.Workers, r.PS, r.NaNPolicy = 1, 1, policy
			srv := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
			if _, err := srv.Init(context.Background(), &pb.InitRequest{RunId: "r", NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
				Params: wire.Bytes(make([]float32, n)), Generation: 1, ModelSpec: convert.ModelSpec(spec)}); err != nil {
				t.Fatal(err)
			}
			g := make([]float32, n)
			g[1] = float32(math.NaN())
			resp, err := srv.Push(context.Background(), &pb.PushRequest{Worker: 0, Grad: wire.Bytes(g), RunId: "r", Generation: 1})
			switch policy {
			case config.Reject:
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("NaN push under reject: %v, want InvalidArgument", err)
				}
			case config.Skip:
				if err != nil || resp.Outcome != pb.PushResponse_STALE {
					t.Fatalf("NaN push under skip: %v %v, want a dropped push", resp, err)
				}
			}
			v, params, _, _, _ := srv.Snapshot()
			if slices.ContainsFunc(params, func(x float32) bool { return x != 0 }) {
				t.Fatalf("a NaN gradient changed the parameters")
			}
			// One worker, sync: under skip the step completes (with a zero
			// gradient) instead of waiting forever for this worker.
			if want := map[config.NaNPolicy]int64{config.Reject: 0, config.Skip: 1}[policy]; v != want {
				t.Fatalf("version %d after the NaN push, want %d", v, want)
			}
		})
	}
}

// Pull snapshots are shared by the pulls of a version, reused for a later
// version once no data plane pull is writing them, and never reused once
// handed to gRPC (whose encoder may still be reading them).
func TestPullSnapshotsAreReusedOnlyWhenUnread(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	pull := func(worker int32, v int64) (*pb.PullResponse, func()) {
		t.Helper()
		resp, release, err := srv.PullShared(ctx, &pb.PullRequest{Worker: worker, MinVersion: v, RunId: "r", Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Version != v {
			t.Fatalf("pulled version %d, want %d", resp.Version, v)
		}
		return resp, release
	}
	step := func(v int64) { t.Helper(); syncStep(t, srv, v, 1, n) }
	same := func(a, b []byte) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }

	a0, relA0 := pull(0, 0)
	b0, relB0 := pull(1, 0)
	if !same(a0.Params, b0.Params) {
		t.Fatal("two pulls of one version got different snapshots")
	}
	v0 := slices.Clone(a0.Params)
	relB0()
	step(0)
	a1, relA1 := pull(0, 1)
	if same(a1.Params, a0.Params) {
		t.Fatal("a snapshot still being written was reused")
	}
	if !slices.Equal(a0.Params, v0) {
		t.Fatal("a snapshot changed while a pull held it")
	}
	relA0()
	relA1()
	step(1)
	a2, relA2 := pull(0, 2)
	if !same(a2.Params, a1.Params) && !same(a2.Params, a0.Params) {
		t.Fatal("neither released snapshot was reused")
	}
	if !slices.Equal(a2.Params, shardParams(srv)) {
		t.Fatal("a reused snapshot does not hold the current parameters")
	}
	g2, err := srv.Pull(ctx, &pb.PullRequest{Worker: 1, MinVersion: 2, RunId: "r", Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	kept := slices.Clone(g2.Params)
	relA2()
	step(2)
	a3, relA3 := pull(0, 3)
	defer relA3()
	if same(a3.Params, g2.Params) || !slices.Equal(g2.Params, kept) {
		t.Fatal("a snapshot handed to gRPC was reused")
	}
}

// Two snapshots released between two versions' snapshots are both kept
// for reuse: a same-host data plane holds a version's snapshot until its
// connections ask again, which can be after the next version's was made.
func TestTwoReleasedSnapshotsAreBothReused(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	pull := func(v int64) (*pb.PullResponse, func()) { t.Helper(); return pullShared(t, srv, v) }
	step := func(v int64) { t.Helper(); syncStep(t, srv, v, 1, n) }
	same := func(a, b []byte) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }
	p0, rel0 := pull(0)
	step(0)
	p1, rel1 := pull(1) // 0 and 1 held: 1 is new
	step(1)
	p2, rel2 := pull(2) // 0, 1 and 2 held: 2 is new
	rel0()
	rel1() // two spares now
	step(2)
	p3, rel3 := pull(3)
	step(3)
	p4, rel4 := pull(4) // 2 and 3 held: 4 takes the other spare
	defer rel2()
	defer rel3()
	defer rel4()
	for i, p := range []*pb.PullResponse{p3, p4} {
		if !same(p.Params, p0.Params) && !same(p.Params, p1.Params) {
			t.Fatalf("version %d's snapshot is a new buffer with two released ones spare", 3+i)
		}
	}
	if same(p3.Params, p4.Params) || same(p4.Params, p2.Params) || same(p3.Params, p2.Params) {
		t.Fatal("one buffer holds two versions' snapshots at once")
	}
}

// Two checkpoints waiting for the same version share one snapshot, and
// each releases its own hold on the pull snapshot: none is left held (it
// could never be reused) and none is released twice (it could be reused
// while the other is still writing it).
func TestCheckpointsOfOneVersionHoldTheSnapshotOnceEach(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	errs := make(chan error, 2)
	for step := int64(1); step <= 2; step++ {
		go func() {
			_, err := srv.Checkpoint(context.Background(), &pb.CheckpointRequest{Step: step, AtVersion: 1, RunId: "r"})
			errs <- err
		}()
	}
	waitPending(t, srv, 2)
	push(t, srv, 0, 0, 1, n)
	push(t, srv, 1, 0, 1, n)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.snap == nil {
		t.Fatal("no pull snapshot after the checkpoints")
	}
	if srv.snap.version != 1 || srv.snap.readers != 0 {
		t.Fatalf("pull snapshot after both checkpoints: version %d, %d holders; want version 1, none", srv.snap.version, srv.snap.readers)
	}
}

// A run with --wire-dtype bf16 takes pushes of 2 bytes per value and
// refuses others (a float32 push, an odd length) as bad input.
func TestBF16PushesAreWidenedOrRefused(t *testing.T) {
	srv, _, n := newTestServer(t, 0, func(r *config.Run) {
		r.Workers, r.PS, r.Optimizer, r.LR, r.WireDType = 1, 1, "sgd", 1, config.BF16
	})
	g := make([]float32, n)
	for i := range g {
		g[i] = 1 + float32(i)/1000 // most of these are not bfloat16 values
	}
	for _, bad := range [][]byte{wire.Bytes(g), make([]byte, 2*n+1)} {
		_, err := srv.Push(context.Background(), &pb.PushRequest{Grad: bad, RunId: "r"})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a push of %d bytes for %d values: %v, want InvalidArgument", len(bad), n, err)
		}
	}
	half := make([]byte, 2*n)
	wire.PutBF16(half, g)
	if _, err := srv.Push(context.Background(), &pb.PushRequest{Grad: half, RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	_, params, _, _, err := srv.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	for i := range params {
		if want := -wire.FromBF16(wire.BF16(g[i])); params[i] != want {
			t.Fatalf("param %d = %v after one sgd step at lr 1, want %v", i, params[i], want)
		}
	}
}

// A shard receives only its options (InitRequest.shard_options): the
// chief's OptionsFor resolves what it can, the options survive the trip, and
// Init refuses missing or impossible options with InvalidArgument naming
// the option, leaving the shard as it was.
func TestInitShardOptions(t *testing.T) {
	r := config.Default()
	r.Workers, r.ReplicasToAggregate, r.NaNPolicy, r.WireDType = 3, 0, config.Skip, config.BF16
	o := OptionsFor(r)
	if o.Replicas != 3 || o.Workers != 3 || o.Mode != config.Sync || o.Optimizer != r.Optimizer || o.LRSchedule != r.LRSchedule {
		t.Fatalf("OptionsFor = %+v", o)
	}
	if back, err := OptionsFromProto(o.Proto()); err != nil || back != o {
		t.Fatalf("round trip: %+v, %v", back, err)
	}

	srv, _, n := newSyncServer(t, 1)
	good := OptionsFor(config.Default())
	for name, c := range map[string]struct {
		options *pb.ShardOptions
		says    string
	}{
		"none":             {nil, "none in the init request"},
		"empty":            {&pb.ShardOptions{}, "workers"},
		"zero replicas":    {with(good, func(o *Options) { o.Replicas = 0 }), "replicas"},
		"replicas > wkrs":  {with(good, func(o *Options) { o.Replicas = o.Workers + 1 }), "replicas"},
		"zero workers":     {with(good, func(o *Options) { o.Workers, o.Replicas = 0, 0 }), "workers must"},
		"mode":             {with(good, func(o *Options) { o.Mode = "bsp" }), "mode must"},
		"optimizer":        {with(good, func(o *Options) { o.Optimizer = "rmsprop" }), "optimizer must"},
		"lr":               {with(good, func(o *Options) { o.LR = 0 }), "lr must"},
		"momentum":         {with(good, func(o *Options) { o.Momentum = 1 }), "momentum must"},
		"lr schedule":      {with(good, func(o *Options) { o.LRSchedule = "linear" }), "lr_schedule"},
		"warmup":           {with(good, func(o *Options) { o.WarmupSteps = -1 }), "warmup_steps must"},
		"staleness":        {with(good, func(o *Options) { o.Staleness = -1 }), "staleness must"},
		"nan policy":       {with(good, func(o *Options) { o.NaNPolicy = "drop" }), "nan_policy must"},
		"wire dtype":       {with(good, func(o *Options) { o.WireDType = "fp8" }), "wire_dtype must"},
		"nan policy unset": {with(good, func(o *Options) { o.NaNPolicy = "" }), "nan_policy must"},
		"norm guard":       {with(good, func(o *Options) { o.NormGuard = 1 }), "norm_guard must"},
		"aggregate":        {with(good, func(o *Options) { o.Aggregate = "median" }), "aggregate must"},
		"trimmed async":    {with(good, func(o *Options) { o.Mode, o.Aggregate = config.Async, config.TrimmedMean }), "needs mode sync"},
	} {
		_, err := srv.Init(context.Background(), &pb.InitRequest{RunId: "other", NumShards: 1, ShardOptions: c.options,
			Params: wire.Bytes(make([]float32, n)), Generation: 2})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: Init said %v, want InvalidArgument mentioning %q", name, err, c.says)
		}
		if err != nil && strings.Contains(err.Error(), "--") {
			t.Errorf("%s: a shard's error names a command-line flag: %v", name, err)
		}
	}
	if st, _ := srv.Status(context.Background(), &pb.StatusRequest{}); st.RunId != "r" || st.Generation != 1 {
		t.Errorf("a refused Init changed the shard: run %q generation %d", st.RunId, st.Generation)
	}
}

// with is o changed by f, on the wire.
func with(o Options, f func(*Options)) *pb.ShardOptions {
	f(&o)
	return o.Proto()
}

// PullSharedNow answers a pull that need not wait like PullShared, holding
// the snapshot until released, and holds nothing for one that would wait.
func TestPullSharedNowAnswersOnlyReadyPulls(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	now := func(worker int32, v int64) (*pb.PullResponse, func(), bool) {
		t.Helper()
		resp, release, ready, err := srv.PullSharedNow(&pb.PullRequest{Worker: worker, MinVersion: v, RunId: "r", Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		return resp, release, ready
	}
	if _, _, ready := now(0, 1); ready {
		t.Fatal("a pull of version 1 at version 0 was answered at once")
	}
	srv.mu.Lock()
	held := srv.snap != nil && srv.snap.readers > 0
	srv.mu.Unlock()
	if held {
		t.Fatal("a pull that would wait left the snapshot held")
	}
	push(t, srv, 0, 0, 1, n)
	push(t, srv, 1, 0, 1, n)
	resp, release, ready := now(0, 1)
	if !ready || resp.Version != 1 {
		t.Fatalf("a pull of the current version: ready %v, %+v", ready, resp)
	}
	_, params, _, _, err := srv.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.Params, wire.Bytes(params)) {
		t.Fatal("the answer does not hold the current parameters")
	}
	srv.mu.Lock()
	readers := srv.snap.readers
	srv.mu.Unlock()
	release()
	srv.mu.Lock()
	after := srv.snap.readers
	srv.mu.Unlock()
	if readers < 1 || after != readers-1 {
		t.Fatalf("snapshot readers %d while held, %d after release", readers, after)
	}
	if _, _, _, err := srv.PullSharedNow(&pb.PullRequest{RunId: "other"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a pull for another run: %v", err)
	}
}

// A pull that finds the shard not initialised waits for the chief's Init
// (InitWait) instead of being refused at once, so a worker's first step
// starts when the Init lands, not after its retry's back-off; the data
// plane's non-blocking path hands it to the waiting one.
func TestPullWaitsForInit(t *testing.T) {
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, err := partition.New(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := config.Default()
	r.Workers, r.PS, r.LRSchedule = 2, 1, "constant"
	initReq := &pb.InitRequest{RunId: "r", Shard: 0, NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
		Params: wire.Bytes(make([]float32, plan.Shards[0].Size)), Generation: 1, ModelSpec: convert.ModelSpec(spec)}
	pullReq := &pb.PullRequest{Worker: 0, RunId: "r", Generation: 1}
	newSrv := func() *Server {
		return NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
	}

	// Not refused at once: a pull whose context ends first is answered
	// only then.
	srv := newSrv()
	if _, _, ready, err := srv.PullSharedNow(pullReq); ready || err != nil {
		t.Fatalf("PullSharedNow before the Init: ready %v, err %v; want not ready, no error (the waiting path answers)", ready, err)
	}
	const short = 50 * time.Millisecond
	start := time.Now() // before the context: its deadline counts from here on
	ctx, cancel := context.WithTimeout(context.Background(), short)
	_, err = srv.Pull(ctx, pullReq)
	cancel()
	if took := time.Since(start); status.Code(err) != codes.Unavailable || took < short {
		t.Fatalf("a pull before the Init with a %v context: %v after %v; want Unavailable once the context ended", short, err, took)
	}

	// Answered once the Init lands (each round races the pull against
	// the Init; refused at once, some pull would come first and fail).
	for range 20 {
		srv := newSrv()
		done := make(chan error, 1)
		go func() {
			_, err := srv.Pull(context.Background(), pullReq)
			done <- err
		}()
		if _, err := srv.Init(context.Background(), initReq); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("a pull racing the Init: %v", err)
		}
	}

	// Bounded: with no Init, Unavailable after InitWait.
	start = time.Now()
	_, err = newSrv().Pull(context.Background(), pullReq)
	if took := time.Since(start); status.Code(err) != codes.Unavailable || took < InitWait {
		t.Fatalf("a pull with no Init: %v after %v; want Unavailable after %v", err, took, InitWait)
	}
}

// TestInitOfAWeightedLayout: a shard of a rebalanced layout is checked
// against its weighted share (the even share of the same count is
// refused), and the plan it keeps is the weighted one.
func TestInitOfAWeightedLayout(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	weighted, _ := partition.Weighted(spec, []int{250, 750})
	even, _ := partition.New(spec, 2)
	r := config.Default()
	r.LRSchedule = "constant"
	init := func(n int) error {
		srv := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
		_, err := srv.Init(context.Background(), &pb.InitRequest{RunId: "r", Shard: 0, NumShards: 2, ShardOptions: OptionsFor(r).Proto(),
			Params: wire.Bytes(make([]float32, n)), Generation: 1, ModelSpec: convert.ModelSpec(spec), ShardWeights: []int32{250, 750}})
		if err == nil && srv.plan.Shards[0].Size != n {
			t.Errorf("the shard keeps a plan of %d parameters, was sent %d", srv.plan.Shards[0].Size, n)
		}
		return err
	}
	if err := init(weighted.Shards[0].Size); err != nil {
		t.Errorf("the weighted share (%d): %v", weighted.Shards[0].Size, err)
	}
	if err := init(even.Shards[0].Size); err == nil {
		t.Errorf("the even share (%d) of a weighted layout was taken", even.Shards[0].Size)
	}
}

// A stopped primary is drained once every live worker was answered done,
// by a pull or a push; a shard still training has nothing to drain, and
// an Init starts the count again.
func TestDrainedOnceEveryLiveWorkerIsToldDone(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	ctx := context.Background()
	if !srv.Drained() {
		t.Fatal("a shard still training is not drained")
	}
	push(t, srv, 0, 0, 1, n)
	if _, err := srv.Stop(ctx, &pb.StopRequest{}); err != nil {
		t.Fatal(err)
	}
	if srv.Drained() {
		t.Fatal("drained before any worker was told training is done")
	}
	if resp, err := srv.Pull(ctx, &pb.PullRequest{Worker: 0, RunId: "r"}); err != nil || !resp.Done {
		t.Fatalf("worker 0's pull after the stop: %v, %v", resp, err)
	}
	if srv.Drained() {
		t.Fatal("drained with worker 1 not told")
	}
	if resp := push(t, srv, 1, 0, 1, n); !resp.Done {
		t.Fatal("worker 1's push after the stop was not answered done")
	}
	if !srv.Drained() {
		t.Fatal("not drained once both workers were told")
	}
	if err := initWith(srv, n, 2, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Stop(ctx, &pb.StopRequest{}); err != nil {
		t.Fatal(err)
	}
	if srv.Drained() {
		t.Fatal("drained after a new Init and stop, with no worker told since")
	}
	// A shard a PS count change holds answers no worker: its process,
	// removed by the change, has none to wait for.
	if err := initWith(srv, n, 3, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.SetMembership(ctx, &pb.MembershipRequest{LiveWorkers: []int32{0, 1}, Members: 2, Replicas: 2, MaxVersion: 100, HoldAt: 1}); err != nil {
		t.Fatal(err)
	}
	push(t, srv, 0, 0, 3, n)
	push(t, srv, 1, 0, 3, n) // the step to the hold
	if _, err := srv.Stop(ctx, &pb.StopRequest{}); err != nil {
		t.Fatal(err)
	}
	if !srv.Drained() {
		t.Fatal("a shard held at a PS count change's boundary waits for workers it answers nothing")
	}
}

// A chief's pull closes the shard's attribution window; one with
// min_version set (the chief pulls the shard again, for the evaluation
// it just pulled it for) keeps it, and still retains what it sends.
func TestChiefRepullKeepsTheWindow(t *testing.T) {
	srv, _, n := newTestServer(t, 1, func(r *config.Run) { r.Workers = 1 })
	ctx := context.Background()
	window := func() (int64, int64) {
		st, err := srv.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st.WindowFrom, st.WindowTo
	}
	push(t, srv, 0, 0, 1, n)
	if _, err := srv.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	from, to := window()
	push(t, srv, 0, 1, 1, n)
	resp, err := srv.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r", MinVersion: 2, Retain: true})
	if err != nil || resp.Version != 2 {
		t.Fatalf("pull at min_version 2: %v, %v", resp, err)
	}
	if f, t2 := window(); f != from || t2 != to {
		t.Errorf("window [%d, %d] after the pull again, want the first pull's [%d, %d]", f, t2, from, to)
	}
	srv.mu.Lock()
	retained := srv.retained != nil && srv.retained.version == 2
	srv.mu.Unlock()
	if !retained {
		t.Error("the pull again did not retain version 2")
	}
	if _, err := srv.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	if f, t2 := window(); f == from && t2 == to {
		t.Errorf("window [%d, %d] unchanged by the next evaluation's pull", f, t2)
	}
}
