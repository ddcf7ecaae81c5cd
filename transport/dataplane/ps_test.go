package dataplane

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
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
	srv := ps.NewServer(log, nil, nil)
	store := checkpoint.NewStore(checkpoint.NewMemFS(), "/ck", 0)
	srv.SetCheckpointStore(store)
	ctx := context.Background()
	if _, err := srv.Init(ctx, &pb.InitRequest{RunId: "r", NumShards: 1, ShardOptions: ps.OptionsFor(r).JSON(), ModelSpec: spec.JSON(),
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
