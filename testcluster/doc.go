// Package testcluster runs a whole pstrain cluster inside one process: N
// parameter-server shards, an optional chief and M workers, each built by
// the constructor that builds the task process (task.NewPS, task.NewChief,
// task.NewWorker), over real gRPC servers and clients. It is the one in-process harness: the worker and chief cluster
// tests and the bench package's in-process measurements use it.
//
// # Starting a cluster
//
// A test describes the run and the model, and gets a cluster whose Close
// is registered with t.Cleanup:
//
//	run := config.Default() // 2 PS, 2 workers, sync
//	run.Hidden, run.Batch, run.LR, run.TargetAccuracy = []int{16}, 16, 0.05, 0
//	train, test := testcluster.SyntheticSplit(512, 128, 16, 4, 1)
//	c := testcluster.New(t, testcluster.Config{Run: run, Spec: run.Spec(16, 4), Train: train,
//		Chief: &testcluster.ChiefConfig{Test: test}})
//	if err := c.StartWorkers(testcluster.WorkerOptions{}); err != nil {
//		t.Fatal(err)
//	}
//	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
//	defer cancel()
//	rep, err := c.Chief().Wait(ctx) // the chief's report
//	...
//	err = c.WaitWorkers(ctx)         // every worker's error, named
//	errs := c.Errors()               // every goroutine's unexpected error
//
// Without a chief (Config.Chief nil) the cluster initialises the shards
// itself and a test stands in for the chief where it needs one (through
// PS.Client, e.g. SetMembership). Code that is not a test (bench) calls
// Start and Close itself, and may run its own worker.Worker over the
// connections Dial returns. The package does not import testing: New
// takes the small TB interface that *testing.T satisfies.
//
// What runs, and how:
//
//   - Each PS is a task.PS (a ps.Server behind the task's gRPC server)
//     on a bufconn listener (Transport Bufconn, the default: no ports) or
//     on 127.0.0.1 (Loopback, as the real processes); the cluster's
//     dialer reaches the listener that serves each address. With
//     run.DataPlane config.TCP it also serves the TCP data plane on
//     127.0.0.1, and workers find it the way a worker process does: the
//     PS reports its address in Status. Unlike a PS process, it serves on
//     after the chief's order to exit, until Kill or Close.
//   - With a ChiefConfig, a task.Chief runs in a goroutine; every PS and
//     worker registers with it, workers send heartbeats, and the chief
//     initialises (and restores) the shards. Without one, Start
//     initialises the shards itself from Spec.Init(Run.Seed), training
//     ending at Config.MaxVersion, sending them ps.OptionsFor(Run) as the
//     chief does.
//   - A worker (StartWorker) is a task.Worker: it registers with the
//     chief (when there is one), connects to every shard as a worker
//     process does, reads its data shards of Config.Train (or
//     WorkerOptions.Batches) and runs worker.Worker.Run.
//   - With run.CheckpointDir set, the chief and every PS share one
//     checkpoint filesystem (Config.CheckpointFS, an in-memory
//     checkpoint.MemFS unless given), as the processes share a directory.
//
// # Faults
//
// Worker.Kill cancels a worker and waits for it; StartWorker with the
// same index starts it again (it registers again, like a restarted
// process). PS.Kill stops a shard's servers (its clients see
// Unavailable); PS.Start serves a fresh, uninitialised shard at the same
// address, so every client's connection reconnects to it; PS.Restart is
// both. The chief then restores the shard as it would a restarted
// process.
//
// # Waiting and results
//
// Nothing here sleeps to let things settle: WaitFor polls a condition
// until a context's deadline. Chief.Wait returns the chief's report and
// error; Worker.Wait and WaitWorkers a worker's; Errors lists every error
// of a goroutine the cluster started that was not the expected end of a
// kill or of Close. Close stops every goroutine the cluster started and
// waits for them.
package testcluster
