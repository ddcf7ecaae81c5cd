package testcluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/ml/dataset"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/task"
	"github.com/pstrain/pstrain/worker"
)

// WorkerOptions configure one worker incarnation.
type WorkerOptions struct {
	// Context, if set, is the worker's parent: when it ends the worker is
	// killed (Close kills it in any case).
	Context context.Context
	// Batches makes the worker's batch source once it knows its data
	// shard: the chief's assignment, or shard Index of Run.Workers
	// without a chief. nil: with a chief, the shards of its data plan of
	// Config.Train, read as a worker process reads them; without one,
	// that shard of Config.Train (NewBatches).
	Batches func(dataShard, numShards int) worker.BatchSource
	// Tweak, if set, has the last word on the worker's configuration (its
	// hooks, metrics, retry patience).
	Tweak func(*worker.Config)
}

// Worker is one incarnation of a worker task.
type Worker struct {
	c      *Cluster
	index  int
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the incarnation's goroutines have ended

	mu  sync.Mutex
	w   *worker.Worker       // nil until built
	reg *pb.RegisterResponse // nil without a chief, or before registration
	// Set before done is closed: Run's error, and whether it was the
	// expected end of a kill or of Close.
	err      error
	expected bool
}

// StartWorker starts worker index (0 <= index < Run.WorkerSlots(): an
// elastic run's workers may go past Run.Workers, docs/elastic.md), or
// starts it again after it ended (it registers again, like a restarted
// process).
func (c *Cluster) StartWorker(index int, o WorkerOptions) (*Worker, error) {
	if index < 0 || index >= c.cfg.Run.WorkerSlots() {
		return nil, fmt.Errorf("testcluster: worker index %d out of range (the run has at most %d)", index, c.cfg.Run.WorkerSlots())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("testcluster: the cluster is closed")
	}
	if prev := c.latest(index); prev != nil && !isDone(prev.done) {
		return nil, fmt.Errorf("testcluster: worker/%d is running; kill it first", index)
	}
	parent := o.Context
	if parent == nil {
		parent = c.ctx
	}
	w := &Worker{c: c, index: index, done: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(parent)
	stop := context.AfterFunc(c.ctx, w.cancel) // Close ends it whatever its parent
	c.workers = append(c.workers, w)
	c.goroutine(func() {
		defer close(w.done)
		defer stop()
		defer w.cancel()
		err := w.run(o)
		expected := err != nil && w.ctx.Err() != nil
		w.mu.Lock()
		w.err, w.expected = err, expected
		w.mu.Unlock()
		if err != nil && !expected {
			c.record(fmt.Sprintf("worker/%d", index), err)
		}
	})
	return w, nil
}

// StartWorkers starts every worker of the run with the same options.
func (c *Cluster) StartWorkers(o WorkerOptions) error {
	for i := 0; i < c.cfg.Run.Workers; i++ {
		if _, err := c.StartWorker(i, o); err != nil {
			return err
		}
	}
	return nil
}

// Worker is worker index's latest incarnation (nil if never started).
func (c *Cluster) Worker(index int) *Worker {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.latest(index)
}

// latest is worker index's latest incarnation. Call with mu held.
func (c *Cluster) latest(index int) *Worker {
	for i := len(c.workers) - 1; i >= 0; i-- {
		if c.workers[i].index == index {
			return c.workers[i]
		}
	}
	return nil
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// WaitWorkers waits until every worker incarnation started so far has
// ended, and returns their errors (except the expected ends of kills),
// each named. If ctx ends first it also names the workers still running
// and their step.
func (c *Cluster) WaitWorkers(ctx context.Context) error {
	c.mu.Lock()
	ws := append([]*Worker(nil), c.workers...)
	c.mu.Unlock()
	var running []string
	for _, w := range ws {
		select {
		case <-w.done:
		case <-ctx.Done():
		}
		if !isDone(w.done) {
			step, _ := w.Progress()
			running = append(running, fmt.Sprintf("worker/%d at step %d", w.index, step))
		}
	}
	var errs []error
	if len(running) > 0 {
		errs = append(errs, fmt.Errorf("testcluster: %w waiting for the workers; still running: %s", ctx.Err(), strings.Join(running, ", ")))
	}
	for _, w := range ws {
		if !isDone(w.done) {
			continue
		}
		w.mu.Lock()
		err, expected := w.err, w.expected
		w.mu.Unlock()
		if err != nil && !expected {
			errs = append(errs, fmt.Errorf("worker/%d: %w", w.index, err))
		}
	}
	return errors.Join(errs...)
}

// Index is the worker's task index.
func (w *Worker) Index() int { return w.index }

// Kill cancels the worker, as kill -9 ends its process, and waits until
// it has stopped. Do not call it from the worker's own hooks (cancel the
// WorkerOptions.Context there).
func (w *Worker) Kill() {
	w.cancel()
	<-w.done
}

// Done is closed when the worker has stopped.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Err is the worker's Run error once it has stopped: nil when training
// ended, the context's error when it was killed.
func (w *Worker) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Wait waits for the worker to stop and returns Err, or ctx's error if
// ctx ends first.
func (w *Worker) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.Err()
	case <-ctx.Done():
		return fmt.Errorf("testcluster: waiting for worker/%d: %w", w.index, ctx.Err())
	}
}

// Progress is the worker's steps done and last loss (0 before it runs).
func (w *Worker) Progress() (int64, float32) {
	w.mu.Lock()
	ww := w.w
	w.mu.Unlock()
	if ww == nil {
		return 0, 0
	}
	return ww.Progress()
}

// EarlyPushes is worker.Worker.EarlyPushes of the incarnation (0 before
// it is built).
func (w *Worker) EarlyPushes() int64 { return w.count((*worker.Worker).EarlyPushes) }

// AheadSteps is worker.Worker.AheadSteps of the incarnation (0 before
// it is built).
func (w *Worker) AheadSteps() int64 { return w.count((*worker.Worker).AheadSteps) }

// count is f of the incarnation, 0 before it is built.
func (w *Worker) count(f func(*worker.Worker) int64) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.w == nil {
		return 0
	}
	return f(w.w)
}

// Registration is the chief's answer to the worker's registration (nil
// without a chief, or before it registered).
func (w *Worker) Registration() *pb.RegisterResponse {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reg
}

// buildMu serialises building nets in this process (task.Builds):
// gorgonia's graph construction (nn.New, and so chief.NewEvaluator) is
// not safe for concurrent use (Grad caches hash codes in nodes shared by
// every graph), which one process per task never exercises.
var buildMu sync.Mutex

// Dial connects to every shard as a worker process does (task.DialShards):
// a gRPC connection per shard and, on the TCP data plane, a data-plane
// client per shard, which follow restarted shards. For code that runs its
// own worker.Worker (bench); Close closes the connections. Its requests
// are signed as worker 0, with a session of its own.
func (c *Cluster) Dial() ([]worker.Shard, error) {
	shards, closeShards, err := task.DialShards(c.options(cluster.Task{Type: cluster.Worker}, c.cfg.RetryTimeout), c.network(nil, ""))
	if err != nil {
		return nil, err
	}
	c.own(closerFunc(closeShards))
	return shards, nil
}

type closerFunc func()

func (f closerFunc) Close() error { f(); return nil }

// run is the worker process: task.NewWorker (register, connect to every
// shard, build the net) and its Run, with heartbeats to the chief.
func (w *Worker) run(o WorkerOptions) error {
	c := w.c
	r := c.cfg.Run
	d := task.WorkerDeps{Network: c.network(nil, ""), Spec: c.cfg.Spec, RunID: c.cfg.RunID, Builds: &buildMu, Tweak: o.Tweak}
	train := c.cfg.Train
	switch {
	case o.Batches != nil:
		d.Batches = o.Batches
	case train != nil && c.chief != nil:
		// The shards of the chief's data plan, as a worker process reads them.
		d.Load = func(i, n int) (dataset.Samples, error) { return train.Shard(i, n), nil }
	case train != nil:
		d.Batches = func(shard, n int) worker.BatchSource {
			return NewBatches(train.Shard(shard, n), r.Batch, r.Seed+int64(shard))
		}
	default:
		return errors.New("testcluster: no training data: set WorkerOptions.Batches or Config.Train")
	}
	t, err := task.NewWorker(w.ctx, c.options(cluster.Task{Type: cluster.Worker, Index: w.index}, c.cfg.RetryTimeout), d)
	if err != nil {
		return err
	}
	defer t.Close()
	w.mu.Lock()
	w.w, w.reg = t.Worker(), t.Registration()
	w.mu.Unlock()
	return t.Run(w.ctx)
}
