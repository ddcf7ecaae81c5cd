package chief_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/worker"
)

// The in-process cluster tests run the real chief (chief.New and Run)
// with real PS shards and workers over bufconn (package testcluster), on a
// tiny synthetic task: 16 inputs, 4 classes, 512 training and 128 test
// samples.
const (
	dim, classes  = 16, 4
	nTrain, nTest = 512, 128
)

// tinyRun is the default run (2 PS, 2 workers, sync, momentum, TCP data
// plane) on a tiny MLP, for all its epochs (no target), with checkpoints
// in the cluster's in-memory filesystem.
func tinyRun(mode config.Mode, epochs float64) config.Run {
	run := config.Default()
	run.Mode, run.Epochs = mode, epochs
	run.Hidden, run.Batch = []int{16}, 16
	// A step size for this task rather than MNIST's: 0.2 with momentum
	// can diverge on it, and a NaN gradient stops a worker.
	run.LR = 0.05
	run.TargetAccuracy = 0
	run.EvalEvery = 100 * time.Millisecond
	run.CheckpointDir = "checkpoints"
	return run
}

// startCluster starts the cluster and the chief; the test starts the
// workers.
func startCluster(t *testing.T, run config.Run) (*testcluster.Cluster, *dataset.Dataset) {
	t.Helper()
	train, test := testcluster.SyntheticSplit(nTrain, nTest, dim, classes, 1)
	c := testcluster.New(t, testcluster.Config{Run: run, Spec: run.Spec(dim, classes), Train: train,
		Chief: &testcluster.ChiefConfig{Test: test, PollEvery: 10 * time.Millisecond}})
	return c, train
}

// startRun starts the cluster, the chief and every worker; opts are the
// workers' options.
func startRun(t *testing.T, run config.Run, opts testcluster.WorkerOptions) (*testcluster.Cluster, *dataset.Dataset) {
	t.Helper()
	c, train := startCluster(t, run)
	if err := c.StartWorkers(opts); err != nil {
		t.Fatal(err)
	}
	return c, train
}

// finish waits for the chief's report and for the workers, and checks
// that the run trained all its epochs with no error anywhere.
func finish(t *testing.T, c *testcluster.Cluster, run config.Run, train *dataset.Dataset) *report.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	rep, err := c.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StoppedBy != "epochs" {
		t.Errorf("stopped by %q, want epochs", rep.StoppedBy)
	}
	if want := chief.MaxSteps(run, train.N); rep.GlobalSteps != want {
		t.Errorf("global steps %d, want chief.MaxSteps = %d", rep.GlobalSteps, want)
	}
	if len(rep.Evals) == 0 {
		t.Error("no evaluation in the report")
	}
	t.Logf("%s: %d global steps, test accuracy %.3f, %d evaluations, restarts %+v, checkpoints %+v",
		rep.Mode, rep.GlobalSteps, rep.TestAccuracy, len(rep.Evals), rep.Restarts, rep.Checkpoints)
	return rep
}

// TestClusterSync: the default cluster's shape trains its epochs, and
// the final checkpoint holds the last step.
func TestClusterSync(t *testing.T) {
	run := tinyRun(config.Sync, 3)
	c, train := startRun(t, run, testcluster.WorkerOptions{})
	rep := finish(t, c, run, train)
	if rep.TestAccuracy < 0.9 {
		t.Errorf("test accuracy %.3f after %d steps; the task is easy", rep.TestAccuracy, rep.GlobalSteps)
	}
	if len(rep.Restarts) != 0 {
		t.Errorf("restarts %+v in a run without faults", rep.Restarts)
	}
	info, _, err := c.Checkpoints().Latest()
	if err != nil {
		t.Fatal(err)
	}
	if info.Step != rep.GlobalSteps || info.Manifest == nil || !info.Manifest.Final {
		t.Errorf("newest checkpoint: step %d (want %d), manifest %+v", info.Step, rep.GlobalSteps, info.Manifest)
	}
}

// TestClusterAsync: the same in async mode, where every push is a global
// step.
func TestClusterAsync(t *testing.T) {
	run := tinyRun(config.Async, 3)
	c, train := startRun(t, run, testcluster.WorkerOptions{})
	finish(t, c, run, train)
}

// pace slows a worker step by a millisecond, so that a fault injected
// when the run reaches some point lands well before its end even on a
// fast machine.
func pace(int64) { time.Sleep(time.Millisecond) }

var paced = testcluster.WorkerOptions{Tweak: func(cfg *worker.Config) { cfg.BeforePush = pace }}

// restartsOf are the report's restarts of task.
func restartsOf(rep *report.Report, task string) []report.Restart {
	var out []report.Restart
	for _, r := range rep.Restarts {
		if r.Task == task {
			out = append(out, r)
		}
	}
	return out
}

// TestClusterPSKilledRollsBack: a PS killed mid-run comes back empty; the
// chief restores every shard (sync) from the newest checkpoint, in a new
// generation, and the run still trains all its epochs.
func TestClusterPSKilledRollsBack(t *testing.T) {
	run := tinyRun(config.Sync, 20)
	run.CheckpointEvery = config.Every{Steps: 10}
	c, train := startRun(t, run, paced)
	maxSteps := chief.MaxSteps(run, train.N)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ckpt int64
	if err := testcluster.WaitFor(ctx, "a committed checkpoint", func() bool {
		infos, err := c.Checkpoints().List()
		if err == nil && len(infos) > 0 && infos[0].Err == nil {
			ckpt = infos[0].Step
		}
		return ckpt >= 10
	}); err != nil {
		t.Fatal(err)
	}
	before, err := c.PS(0).Status()
	if err != nil {
		t.Fatal(err)
	}
	if before.Done || before.Version >= maxSteps {
		t.Fatalf("the run ended (version %d of %d) before the fault: the test proves nothing", before.Version, maxSteps)
	}
	if err := c.PS(1).Restart(); err != nil {
		t.Fatal(err)
	}
	rep := finish(t, c, run, train)

	rs := restartsOf(rep, "ps/1")
	if len(rs) != 1 {
		t.Fatalf("restarts %+v: want one of ps/1", rep.Restarts)
	}
	if r := rs[0]; r.RestoredStep < ckpt || r.RestoredStep >= maxSteps || r.BackAtSeconds == nil {
		t.Errorf("ps/1 restored at step %d: want a checkpoint's step in [%d, %d)", r.RestoredStep, ckpt, maxSteps)
	}
	// Both shards were re-initialised together: one new generation.
	var gens []int64
	for s := 0; s < run.PS; s++ {
		st, err := c.PS(s).Status()
		if err != nil {
			t.Fatal(err)
		}
		gens = append(gens, st.Generation)
	}
	if gens[0] != gens[1] || gens[0] <= before.Generation {
		t.Errorf("generations %v after the rollback, %d before: want both shards in one newer generation", gens, before.Generation)
	}
	if c.PS(1).Starts() != 2 {
		t.Errorf("ps/1 started %d times, want 2", c.PS(1).Starts())
	}
}

// TestClusterWorkerRestarted: a worker killed mid-run and started again
// registers again, gets its data shard, and the run trains all its
// epochs; the chief counts the restart at the step it had reached.
//
// The worker dies before it pushes its step 20 to any shard. (Killed
// between its pushes to two shards is worker/catchup_test.go's case: the
// replacement completes the lagging shard's step with a catch-up push.)
// The shards wait at version 20 for its push (sync), and the
// replacement starts once the chief has read that version: the chief
// records the step it last read, which on a loaded machine could
// otherwise still be 0.
func TestClusterWorkerRestarted(t *testing.T) {
	const killAt = 20
	run := tinyRun(config.Sync, 20)
	train, test := testcluster.SyntheticSplit(nTrain, nTest, dim, classes, 1)
	var seen atomic.Int64 // the chief's step at its latest poll
	c := testcluster.New(t, testcluster.Config{Run: run, Spec: run.Spec(dim, classes), Train: train,
		Chief: &testcluster.ChiefConfig{Test: test, PollEvery: 10 * time.Millisecond,
			OnProgress: func(p chief.Progress) { seen.Store(p.Step) }}})
	if maxSteps := chief.MaxSteps(run, train.N); maxSteps <= 2*killAt {
		t.Fatalf("the run has %d steps: too few to kill a worker at step %d", maxSteps, killAt)
	}
	if _, err := c.StartWorker(0, paced); err != nil {
		t.Fatal(err)
	}
	dying, die := context.WithCancel(context.Background())
	defer die()
	old, err := c.StartWorker(1, testcluster.WorkerOptions{Context: dying, Tweak: func(cfg *worker.Config) {
		cfg.BeforePush = func(step int64) {
			pace(step)
			if step == killAt {
				die() // its pushes of this step fail before they are sent
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := old.Wait(ctx); err == nil || dying.Err() == nil {
		t.Fatalf("worker/1 ended with %v before it was killed", err)
	}
	if st, _ := c.PS(0).Status(); st.Done || st.Version != killAt {
		t.Fatalf("ps/0 at version %d (done %t) after worker/1 died before its step %d", st.Version, st.Done, killAt)
	}
	if err := testcluster.WaitFor(ctx, "the chief to read step 20", func() bool { return seen.Load() >= killAt }); err != nil {
		t.Fatal(err)
	}
	w, err := c.StartWorker(1, paced)
	if err != nil {
		t.Fatal(err)
	}
	rep := finish(t, c, run, train)
	if reg := w.Registration(); reg == nil || reg.DataShard != 1 {
		t.Errorf("the restarted worker's registration: %+v", reg)
	}
	if rs := restartsOf(rep, "worker/1"); len(rs) != 1 || rs[0].RestoredStep != killAt || rs[0].BackAtSeconds == nil {
		t.Errorf("restarts %+v: want one of worker/1, back at step %d", rep.Restarts, killAt)
	}
}

// TestClusterStopsAtPlateau: a run given far more epochs than the tiny
// task needs, with --patience, stops by plateau and hands back the model
// of its best evaluation: the final step is that evaluation's, and the
// newest checkpoint, marked final, holds it.
func TestClusterStopsAtPlateau(t *testing.T) {
	run := tinyRun(config.Sync, 200)
	run.Patience = 2
	c, _ := startRun(t, run, testcluster.WorkerOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := c.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StoppedBy != chief.StopPlateau || len(rep.Evals) < 3 {
		t.Fatalf("stopped by %q after %d steps, %d evaluations; want plateau", rep.StoppedBy, rep.GlobalSteps, len(rep.Evals))
	}
	training := rep.Evals[:len(rep.Evals)-1]
	best := training[0]
	for _, e := range training {
		if e.TestLoss < best.TestLoss {
			best = e
		}
	}
	t.Logf("best evaluation: step %d, loss %.4f; handed back step %d of %d, accuracy %.3f", best.Step, best.TestLoss, rep.FinalStep, rep.GlobalSteps, rep.TestAccuracy)
	if rep.FinalStep != best.Step || rep.FinalStep >= rep.GlobalSteps {
		t.Errorf("handed back the model of step %d of %d, want the best evaluation's, %d", rep.FinalStep, rep.GlobalSteps, best.Step)
	}
	info, _, err := c.Checkpoints().Latest()
	if err != nil {
		t.Fatal(err)
	}
	if info.Step != best.Step || info.Manifest == nil || !info.Manifest.Final {
		t.Errorf("newest checkpoint: step %d (want %d), manifest %+v", info.Step, best.Step, info.Manifest)
	}
}
