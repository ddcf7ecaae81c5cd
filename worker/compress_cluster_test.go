package worker_test

import (
	"context"
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/optim"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/transport/compress"
)

// TestSyncCompressedIsSGDWithErrorFeedback: a sync cluster under
// --compress is, step for step, SGD on the mean of what the shards
// decode of the workers' pushes (each worker's gradient plus its
// residual, encoded), the gradients computed on what each worker's
// compressed pulls built (each a replica of the shard's mirror of it):
// the same weights as a single-process reference that runs the package
// compress state machines by hand, with each direction's codec (an
// uncompressed direction sends the values as they are). Two workers, so that the shards' sum
// of two gradients is the same in either order and the runs are
// bit-for-bit comparable.
func TestSyncCompressedIsSGDWithErrorFeedback(t *testing.T) {
	for _, c := range []struct {
		compress string
		plane    config.DataPlane
	}{{"topk:0.25", config.TCP}, {"int8", config.GRPC}, {"sign", config.TCP},
		{"topk:0.25/int8", config.TCP}, {"none/int8", config.GRPC}, {"topk:0.25/none", config.TCP}} {
		t.Run(c.compress+"/"+string(c.plane), func(t *testing.T) { testSyncCompressed(t, c.compress, c.plane) })
	}
}

func testSyncCompressed(t *testing.T, spec string, plane config.DataPlane) {
	const m, b, steps = 2, syncB, 30
	sp, err := compress.ParseSetting(spec)
	if err != nil {
		t.Fatal(err)
	}
	run := config.Default()
	run.LRSchedule, run.DataPlane, run.Compress = "constant", plane, spec
	run.PS, run.Workers, run.Batch, run.Seed, run.Hidden = 2, m, b, 7, syncSpec.Hidden
	run.LR, run.Momentum, run.Optimizer = 0.05, 0.9, "momentum"
	data := testcluster.Synthetic(500, syncSpec.Input, syncSpec.Classes, 3)
	c := startCluster(t, run, syncSpec, steps)
	for i := range m {
		startWorker(t, c, context.Background(), i, &slice{d: data, index: i, m: m, b: b}, nil)
	}
	waitAll(t, c)
	got, _ := params(t, c)

	// The reference: the shards' parameters, flat, and their optimizers;
	// per worker and shard a mirror, a replica and a push residual.
	plan, err := partition.New(syncSpec, run.PS)
	if err != nil {
		t.Fatal(err)
	}
	pushCodec, pullCodec := sp.Push.Codec(), sp.Pull.Codec()
	init := syncSpec.Init(uint64(run.Seed))
	shard := make([][]float32, run.PS)
	sum := make([][]float32, run.PS)
	var opts []optim.Optimizer
	for s := range shard {
		shard[s] = make([]float32, plan.Shards[s].Size)
		sum[s] = make([]float32, plan.Shards[s].Size)
		plan.Gather(s, init, shard[s])
		o, _ := optim.New(optim.Config{Name: "momentum", LR: run.LR, Momentum: run.Momentum}, len(shard[s]))
		opts = append(opts, o)
	}
	type end struct {
		mirror  *compress.Mirror
		replica *compress.Replica
		fb      *compress.Feedback
	}
	ends := make([][]end, m)
	var srcs []*slice
	for i := range m {
		srcs = append(srcs, &slice{d: data, index: i, m: m, b: b})
		for s := range shard {
			n := len(shard[s])
			ends[i] = append(ends[i], end{compress.NewMirror(pullCodec, n, 1), compress.NewReplica(pullCodec, n), compress.NewFeedback(pushCodec, n)})
		}
	}
	net, err := nn.New(syncSpec, b, true)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	y := make([]uint8, b)
	dec := make([]float32, 0)
	for range steps {
		for s := range sum {
			clear(sum[s])
		}
		for i := range m {
			for s, e := range ends[i] {
				if sp.Pull.Kind == compress.None {
					plan.Scatter(s, shard[s], net.Params())
					continue
				}
				ans, err := e.mirror.Answer(nil, shard[s], e.replica.Base())
				if err == nil {
					err = e.replica.Apply(ans)
				}
				if err != nil {
					t.Fatal(err)
				}
				plan.Scatter(s, e.replica.Values(), net.Params())
			}
			grads := gradsOn(t, net, srcs[i], y)
			for s, e := range ends[i] {
				payload, err := e.fb.Encode(nil, plan.Segments(s, grads))
				if err != nil {
					t.Fatal(err)
				}
				dec = append(dec[:0], make([]float32, len(shard[s]))...)
				if err := pushCodec.Decode(dec, payload); err != nil {
					t.Fatal(err)
				}
				for j, d := range dec {
					sum[s][j] += d
				}
			}
		}
		for s := range shard {
			opts[s].Apply(shard[s], sum[s], 1/float32(m))
		}
	}
	want := make([][]float32, len(init))
	for v := range init {
		want[v] = make([]float32, len(init[v]))
	}
	for s := range shard {
		plan.Scatter(s, shard[s], want)
	}
	if worst := maxDiff(got, want); worst > 1e-6 {
		t.Fatalf("compressed sync cluster and the reference differ by up to %g", worst)
	}
	if worst := maxDiff(want, init); worst == 0 {
		t.Fatal("the reference did not move: the test proves nothing")
	}
}
