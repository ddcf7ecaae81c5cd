package dataplane

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/wire"
)

// Against a real shard: a worker's pull over the data plane carries its
// data position, and the chief's evaluation pull with retain set keeps
// that version for a retained checkpoint while training goes on.
func TestDataPositionAndRetainOverTheDataPlane(t *testing.T) {
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, err := partition.New(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := plan.Shards[0].Size
	r := config.Default()
	r.LRSchedule = "constant" // the update rule under test, not the schedule
	r.Workers, r.PS, r.Optimizer = 1, 1, "momentum"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := checkpoint.NewStore(checkpoint.NewMemFS(), "/ck", 0)
	srv := ps.NewServer(ps.Config{Log: log, Shard: ps.AnyShard, Store: store})
	ctx := context.Background()
	if _, err := srv.Init(ctx, &pb.InitRequest{RunId: "r", NumShards: 1, ShardOptions: ps.OptionsFor(r).Proto(), ModelSpec: convert.ModelSpec(spec),
		Params: wire.Bytes(make([]float32, n)), Generation: 1, DataPositions: []int64{10}, StepsPerEpoch: 100}); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ds := NewServer(srv, lis, Config{MaxPayload: 1 << 20, Log: log})
	go ds.Serve()
	t.Cleanup(func() { ds.Close() })
	c := client(lis.Addr().String(), 1<<20)
	defer c.Close()

	g := make([]float32, n)
	for i := range g {
		g[i] = 0.5
	}
	step := func(v int64) {
		t.Helper()
		if _, err := c.Push(ctx, &pb.PushRequest{Worker: 0, Version: v, Grad: wire.Bytes(g), RunId: "r", Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	step(0)
	step(1)
	resp, err := c.PullInto(ctx, &pb.PullRequest{Worker: 0, MinVersion: 2, RunId: "r", Generation: 1}, [][]float32{make([]float32, n)})
	if err != nil || resp.Version != 2 || resp.DataPosition != 12 {
		t.Fatalf("worker's pull: %v, %v; want version 2 at data position 12", resp, err)
	}
	ev, err := c.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r", Retain: true})
	if err != nil || ev.Version != 2 || ev.DataPosition != 0 {
		t.Fatalf("evaluation pull: %v, %v", ev, err)
	}
	evaluated := slices.Clone(ev.Params)
	step(2)
	ck, err := srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 7, Retained: true, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Version != 2 || !slices.Equal(ck.DataPositions, []int64{12}) {
		t.Fatalf("retained checkpoint: version %d positions %v, want 2 and [12]", ck.Version, ck.DataPositions)
	}
	m := checkpoint.Manifest{Step: 7, Version: 2, Mode: "sync", Shards: []checkpoint.ShardInfo{{Index: 0, File: ck.File,
		SHA256: ck.Sha256, Bytes: ck.Bytes, Tensors: ck.Tensors, Version: 2}}}
	if err := store.Commit(m); err != nil {
		t.Fatal(err)
	}
	loaded, err := store.Load(store.Path(7))
	if err != nil {
		t.Fatal(err)
	}
	st, err := shardckpt.Read(loaded, spec, "momentum")
	if err != nil {
		t.Fatal(err)
	}
	params, _ := st.Shard(plan, 0)
	if !bytes.Equal(wire.Bytes(params), evaluated) {
		t.Fatal("the retained checkpoint does not hold the parameters the evaluation pull got")
	}
	if _, now, _, _, _ := srv.Snapshot(); bytes.Equal(wire.Bytes(now), evaluated) {
		t.Fatal("training did not move on after the evaluation pull")
	}
}

// Hot standbys over the data plane, against real shards: a primary whose
// standby is reached with this package's client keeps it equal to
// itself bit for bit, and once the standby is promoted at a newer epoch
// the old primary's next batch comes back Aborted, which deposes it;
// the promoted standby serves on from the state the old one
// acknowledged.
func TestStandbyOverTheDataPlane(t *testing.T) {
	spec := model.Spec{Input: 6, Hidden: []int{5}, Classes: 3}
	plan, err := partition.New(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	n := plan.Shards[0].Size
	r := config.Default()
	r.Mode, r.Workers, r.PS, r.Optimizer = config.Sync, 2, 1, "momentum"
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	standby := ps.NewServer(ps.Config{Log: log, Shard: 0})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ds := NewServer(standby, lis, Config{MaxPayload: 1 << 20, Log: log})
	go ds.Serve()
	t.Cleanup(func() { ds.Close() })

	var calls atomic.Int64
	primary := ps.NewServer(ps.Config{Log: log, Shard: 0, Dial: func(_ context.Context, addr string) (ps.ReplicaClient, func() error, error) {
		if addr != "standby/0" {
			t.Errorf("dialled %q", addr)
		}
		c := client(lis.Addr().String(), 1<<20)
		return countingReplica{c, &calls}, c.Close, nil
	}})
	t.Cleanup(primary.Close)
	ctx := context.Background()
	params := make([]float32, n)
	for i := range params {
		params[i] = float32(i%5) / 5
	}
	if _, err := primary.Init(ctx, &pb.InitRequest{RunId: "r", NumShards: 1, ShardOptions: ps.OptionsFor(r).Proto(), ModelSpec: convert.ModelSpec(spec),
		Params: wire.Bytes(params), Generation: 1, StepsPerEpoch: 100, MaxVersion: 100, Epoch: 1, StandbyAddr: "standby/0"}); err != nil {
		t.Fatal(err)
	}
	// Pushes are replicated once the standby holds the snapshot.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st, _ := primary.Status(ctx, &pb.StatusRequest{}); st.StandbyAttached {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby never attached")
		}
	}
	push := func(s *ps.Server, w int32, v int64) error {
		g := make([]float32, n)
		for i := range g {
			g[i] = float32((int(w)+1)*(i+3)%7-3) / float32(v+1)
		}
		_, err := s.Push(ctx, &pb.PushRequest{Worker: w, Version: v, Grad: wire.Bytes(g), RunId: "r", Generation: 1, DataPosition: v + 1})
		return err
	}
	const steps = 5
	for v := int64(0); v < steps; v++ {
		for w := int32(0); w < 2; w++ {
			if err := push(primary, w, v); err != nil {
				t.Fatalf("step %d worker %d: %v", v, w, err)
			}
		}
	}
	pv, pp, po, _, _ := primary.Snapshot()
	sv, sp, so, _, err := standby.Snapshot()
	if err != nil || pv != steps || sv != steps || !slices.Equal(pp, sp) || !slices.Equal(po, so) {
		t.Fatalf("standby at version %d (%v), primary at %d: the standby's state differs from its primary's", sv, err, pv)
	}
	if calls.Load() < 1+steps {
		t.Fatalf("%d replicate calls for a snapshot and %d steps", calls.Load(), steps)
	}
	// The chief promotes the standby; the old primary, not dead after
	// all, takes a push: its standby refuses the batch (Aborted over the
	// data plane) and it steps down without acknowledging it.
	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if err := push(primary, 0, steps); status.Code(err) != codes.Unavailable {
		t.Fatalf("a push to the deposed primary: %v, want Unavailable", err)
	}
	if st, _ := primary.Status(ctx, &pb.StatusRequest{}); st.Role != "deposed" {
		t.Fatalf("the old primary's role %q, want deposed", st.Role)
	}
	for w := int32(0); w < 2; w++ {
		if err := push(standby, w, steps); err != nil {
			t.Fatalf("a push to the promoted standby: %v", err)
		}
	}
	if st, _ := standby.Status(ctx, &pb.StatusRequest{}); st.Role != "primary" || st.Version != steps+1 {
		t.Fatalf("the promoted standby: role %q version %d, want primary at %d", st.Role, st.Version, steps+1)
	}
}

// countingReplica counts a replica client's calls.
type countingReplica struct {
	*Client
	n *atomic.Int64
}

func (c countingReplica) Replicate(ctx context.Context, in *pb.ReplicaBatch, opts ...grpc.CallOption) (*pb.ReplicaAck, error) {
	c.n.Add(1)
	return c.Client.Replicate(ctx, in, opts...)
}
