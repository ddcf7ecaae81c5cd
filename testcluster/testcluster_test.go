package testcluster_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/transport/wire"
)

var spec = model.Spec{Input: 8, Hidden: []int{4}, Classes: 3}

func tinyRun(plane config.DataPlane) config.Run {
	run := config.Default()
	run.LRSchedule = "constant" // the update rule under test, not the schedule
	run.PS, run.Workers, run.Batch, run.Hidden, run.LR, run.DataPlane = 2, 2, 4, spec.Hidden, 0.05, plane
	return run
}

// A killed PS refuses connections; a restarted one is fresh, at the same
// address, and every kind of client reaches it again: the cluster's
// control-plane client and a worker's data plane.
func TestPSRestartReconnects(t *testing.T) {
	for _, tr := range []struct {
		name string
		t    testcluster.Transport
	}{{"bufconn", testcluster.Bufconn}, {"loopback", testcluster.Loopback}} {
		for _, plane := range []config.DataPlane{config.GRPC, config.TCP} {
			t.Run(tr.name+"/"+string(plane), func(t *testing.T) { testPSRestart(t, tr.t, plane) })
		}
	}
}

func testPSRestart(t *testing.T, tr testcluster.Transport, plane config.DataPlane) {
	run := tinyRun(plane)
	c := testcluster.New(t, testcluster.Config{Run: run, Spec: spec, Transport: tr, MaxVersion: 10})
	shards, err := c.Dial()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pull := func() (*pb.PullResponse, error) {
		return shards[1].Client.Pull(ctx, &pb.PullRequest{RunId: "test", Worker: 0})
	}
	if resp, err := pull(); err != nil || resp.Version != 0 {
		t.Fatalf("first pull: %v, %v", resp, err)
	}
	p := c.PS(1)
	addr := p.Addr()
	p.Kill()
	if p.Server() != nil {
		t.Fatal("a killed PS still has a server")
	}
	if _, err := p.Client().Status(ctx, &pb.StatusRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("status of a killed PS: %v, want Unavailable", err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if p.Addr() != addr || p.Starts() != 2 {
		t.Fatalf("restarted at %s (was %s), starts %d", p.Addr(), addr, p.Starts())
	}
	if st, err := p.Status(); err != nil || st.Initialized {
		t.Fatalf("a restarted PS should be empty: %+v, %v", st, err)
	}
	// The control plane reconnects (gRPC's backoff may make the first
	// calls fail fast).
	var initErr error
	if err := testcluster.WaitFor(ctx, "the restarted PS to accept Init", func() bool {
		flat := make([]float32, c.Plan().Shards[1].Size)
		_, initErr = p.Client().Init(ctx, &pb.InitRequest{RunId: "test", Shard: 1, NumShards: 2, ShardOptions: ps.OptionsFor(run).Proto(),
			Params: wire.Bytes(flat), Version: 7})
		return initErr == nil
	}); err != nil {
		t.Fatalf("%v (last: %v)", err, initErr)
	}
	var resp *pb.PullResponse
	var pullErr error
	if err := testcluster.WaitFor(ctx, "a pull from the restarted PS", func() bool {
		resp, pullErr = pull()
		return pullErr == nil
	}); err != nil {
		t.Fatalf("%v (last: %v)", err, pullErr)
	}
	if resp.Version != 7 {
		t.Fatalf("pulled version %d from the restarted PS, want its 7", resp.Version)
	}
	if errs := c.Errors(); len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
}

// Workers without a chief train; a killed worker's end is not an error,
// and it can be started again. (Async, so that where the kill lands does
// not matter; a sync worker killed between its pushes is
// worker/catchup_test.go's case.)
func TestWorkersKillAndStartAgain(t *testing.T) {
	run := tinyRun(config.TCP)
	run.Mode = config.Async
	c := testcluster.New(t, testcluster.Config{Run: run, Spec: spec, MaxVersion: 1 << 40, Train: testcluster.Synthetic(64, spec.Input, spec.Classes, 1)})
	if err := c.StartWorkers(testcluster.WorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	version := func() int64 {
		st, err := c.PS(0).Status()
		if err != nil {
			t.Fatal(err)
		}
		return st.Version
	}
	if err := testcluster.WaitFor(ctx, "step 5", func() bool { return version() >= 5 }); err != nil {
		t.Fatal(err)
	}
	w := c.Worker(0)
	if _, err := c.StartWorker(0, testcluster.WorkerOptions{}); err == nil {
		t.Fatal("a running worker was started twice")
	}
	w.Kill()
	if err := w.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("a killed worker's error: %v", err)
	}
	at := version()
	if _, err := c.StartWorker(0, testcluster.WorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := testcluster.WaitFor(ctx, "training to go on", func() bool { s, _ := c.Worker(0).Progress(); return s >= 5 }); err != nil {
		t.Fatalf("%v (version %d, %d before)", err, version(), at)
	}
	if c.Worker(0) == w {
		t.Fatal("Worker(0) is not the latest incarnation")
	}
	if errs := c.Errors(); len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
}

// A worker that fails is an error of the cluster, named, and WaitWorkers
// returns it.
func TestWorkerErrorIsCollected(t *testing.T) {
	run := tinyRun(config.GRPC)
	c := testcluster.New(t, testcluster.Config{Run: run, Spec: spec, MaxVersion: 10})
	w, err := c.StartWorker(1, testcluster.WorkerOptions{}) // no data: it fails at once
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := w.Wait(ctx); err == nil {
		t.Fatal("a worker with no data ran")
	}
	err = c.WaitWorkers(ctx)
	if err == nil || len(c.Errors()) != 1 {
		t.Fatalf("WaitWorkers %v, Errors %v: want the worker's error", err, c.Errors())
	}
	t.Log(err)
}

// Close stops every goroutine the cluster started.
func TestCloseLeavesNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	run := tinyRun(config.TCP)
	train, test := testcluster.SyntheticSplit(64, 16, spec.Input, spec.Classes, 1)
	run.TargetAccuracy, run.CheckpointDir = 0, "ckpt"
	c, err := testcluster.Start(ctx, testcluster.Config{Run: run, Spec: spec, Train: train, Chief: &testcluster.ChiefConfig{Test: test}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartWorkers(testcluster.WorkerOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := testcluster.WaitFor(ctx, "training", func() bool { s, _ := c.Worker(1).Progress(); return s >= 3 }); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if errs := c.Errors(); len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	// gRPC's own goroutines end a moment after their connections close.
	if err := testcluster.WaitFor(ctx, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= before }); err != nil {
		buf := make([]byte, 1<<20)
		t.Fatalf("%v: %d goroutines, %d before\n%s", err, runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
	}
	if _, err := c.StartWorker(0, testcluster.WorkerOptions{}); err == nil {
		t.Fatal("a worker started on a closed cluster")
	}
}
