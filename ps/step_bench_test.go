package ps

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/proccpu"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

// BenchmarkServerSyncStep is the PS's own work in one sync step of
// pstrain bench's ps_overhead cluster (one PS holding the whole MLP
// 784-800-10, momentum) with 1 and 2 workers, without a data plane:
// each worker's push (the gradient's norm, attribution sum and the
// update) and its shared pull of the new version (the pull snapshot).
// cpu-ns/op is the process's CPU time per step.
func BenchmarkServerSyncStep(b *testing.B) {
	for _, workers := range []int{1, 2} {
		b.Run(map[int]string{1: "1worker", 2: "2workers"}[workers], func(b *testing.B) { benchServerStep(b, workers) })
	}
}

func benchServerStep(b *testing.B, workers int) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	plan, err := partition.New(spec, 1)
	if err != nil {
		b.Fatal(err)
	}
	n := plan.Shards[0].Size
	r := config.Default()
	r.LRSchedule, r.Workers, r.PS, r.LR = "constant", workers, 1, 0.001
	srv := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard})
	ctx := context.Background()
	if _, err := srv.Init(ctx, &pb.InitRequest{RunId: "r", Shard: 0, NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
		ModelSpec: convert.ModelSpec(spec), Params: wire.Bytes(make([]float32, n)), Generation: 1}); err != nil {
		b.Fatal(err)
	}
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(i%7) * 1e-3
	}
	grad := wire.Bytes(g)
	b.SetBytes(int64(4 * n))
	cpu0 := processCPU(b)
	b.ResetTimer()
	for v := range int64(b.N) {
		for w := range int32(workers) {
			if _, err := srv.Push(ctx, &pb.PushRequest{Worker: w, Version: v, Grad: grad, RunId: "r", Generation: 1}); err != nil {
				b.Fatal(err)
			}
		}
		for w := range int32(workers) {
			resp, release, err := srv.PullShared(ctx, &pb.PullRequest{Worker: w, MinVersion: v + 1, RunId: "r", Generation: 1})
			if err != nil || resp.Version != v+1 {
				b.Fatalf("pull of version %d: %v %v", v+1, resp, err)
			}
			release()
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
