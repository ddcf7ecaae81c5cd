package dataplane

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/proccpu"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/wire"
)

// BenchmarkSyncStepOfAShard: one sync step of a default cluster's shard
// 0 (the MLP 784-800-10 on 2 PS, momentum), as its PS serves it to two
// same-host workers: each pushes a gradient, then pulls the new version
// and reads it in place (PullView). "copied": the shard's snapshot is
// copied into a shared slot; "lent": the snapshot is kept in the slot
// (ps.Server.UseSnapshotBuffers). Pushes and pulls go one after the
// other, so ns/op is the PS's and the clients' work per step, not a
// barrier's wait; cpu-ns/op is the process's CPU time per step.
func BenchmarkSyncStepOfAShard(b *testing.B) {
	for _, mode := range []string{"copied", "lent"} {
		b.Run(mode, func(b *testing.B) { benchSyncStep(b, mode == "lent", 2, 2) })
	}
}

// BenchmarkSyncStepOnePSOneWorker is BenchmarkSyncStepOfAShard's lent
// step of pstrain bench's ps_overhead cluster: one PS holding the whole
// MLP and one worker.
func BenchmarkSyncStepOnePSOneWorker(b *testing.B) { benchSyncStep(b, true, 1, 1) }

func benchSyncStep(b *testing.B, lend bool, shards, workers int) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	plan, err := partition.New(spec, shards)
	if err != nil {
		b.Fatal(err)
	}
	n := plan.Shards[0].Size
	r := config.Default()
	r.LRSchedule, r.Workers, r.PS, r.LR = "constant", workers, shards, 0.001
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := ps.NewServer(ps.Config{Log: log, Shard: ps.AnyShard})
	ctx := context.Background()
	if _, err := srv.Init(ctx, &pb.InitRequest{RunId: "r", Shard: 0, NumShards: int32(shards), ShardOptions: ps.OptionsFor(r).Proto(),
		ModelSpec: convert.ModelSpec(spec), Params: wire.Bytes(make([]float32, n)), Generation: 1}); err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ds := NewServer(srv, lis, Config{MaxPayload: 8 << 20, Log: log})
	ds.SetPushSize(4 * n) // (as a PS task does at its Init: push buffers are reused)
	go ds.Serve()
	defer ds.Close()
	if ds.SnapshotBuffers() == nil {
		b.Skip("no shared memory on this platform")
	}
	if lend {
		srv.UseSnapshotBuffers(ds.SnapshotBuffers())
		defer srv.ReturnSnapshotBuffers()
	}
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(i%7) * 1e-3
	}
	pushers, pullers := make([]*Client, workers), make([]*Client, workers)
	for w := range workers {
		pushers[w], pullers[w] = client(lis.Addr().String(), 8<<20), client(lis.Addr().String(), 8<<20)
		defer pushers[w].Close()
		defer pullers[w].Close()
	}
	b.SetBytes(int64(4 * n))
	cpu0 := processCPU(b)
	b.ResetTimer()
	for v := range int64(b.N) {
		for w := range workers {
			if _, err := pushers[w].Push(ctx, &pb.PushRequest{Worker: int32(w), Version: v, Grad: wire.Bytes(g), RunId: "r", Generation: 1}); err != nil {
				b.Fatal(err)
			}
		}
		for w := range workers {
			if resp, err := pullers[w].PullView(ctx, &pb.PullRequest{Worker: int32(w), MinVersion: v + 1, RunId: "r", Generation: 1}, nil); err != nil || resp.Version != v+1 {
				b.Fatalf("pull of version %d: %v %v", v+1, resp, err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// processCPU is the process's CPU time so far (user and system).
func processCPU(b *testing.B) time.Duration {
	d, err := proccpu.Self()
	if err != nil {
		b.Fatal(err)
	}
	return d
}
