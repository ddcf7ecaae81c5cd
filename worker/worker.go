// Package worker is the training loop of one worker task: pull the
// parameters from every PS shard in parallel, run the forward and backward
// pass on the next batch of its data shard, push each shard its slice of
// the gradient in parallel, repeat until a shard says training is done.
//
// A worker rides through PS restarts: an unavailable shard is retried with
// exponential backoff until RetryTimeout, after which Run fails with the
// shard's address in the error.
//
// Where a worker is in its data shard is part of the run's state, kept by
// the shards (docs/recovery.md, "Data positions"): each pull answers with
// the number of the worker's batches whose gradients that shard holds, and
// the worker trains on the batch at the largest such number. So a
// restarted worker resumes where its predecessor's gradients stop, a
// rollback to a checkpoint rewinds the data with the model, and a batch
// whose gradient no shard counted (dropped as stale) is used again.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/retry"
	"github.com/pstrain/pstrain/metrics"
	"github.com/pstrain/pstrain/nn"
	"github.com/pstrain/pstrain/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/wire"
)

// BatchSource is a worker's data shard as a sequence of batches numbered
// by position 0, 1, 2, ... across epochs (dataset.FullBatches is the one
// the worker task uses). Next fills x ([batch x input]) and y ([batch])
// with the batch at the current position and moves to the next one;
// SeekBatch makes position the current one, as if that many batches had
// been taken. The worker keeps it at the data position the shards hold.
type BatchSource interface {
	Next(x []float32, y []uint8)
	SeekBatch(position int64)
}

// DataPlane is how a worker pulls from and pushes to one shard: the gRPC
// client, or a dataplane.Client (plain TCP frames).
type DataPlane interface {
	Pull(ctx context.Context, in *pb.PullRequest, opts ...grpc.CallOption) (*pb.PullResponse, error)
	Push(ctx context.Context, in *pb.PushRequest, opts ...grpc.CallOption) (*pb.PushResponse, error)
}

// SegmentedDataPlane is a DataPlane that can read a pull straight into the
// model's parameters and write a push straight from the model's gradients
// (dataplane.Client does): no gather or scatter copy on the worker.
type SegmentedDataPlane interface {
	PullInto(ctx context.Context, in *pb.PullRequest, dst [][]float32) (*pb.PullResponse, error)
	PushSegments(ctx context.Context, in *pb.PushRequest, segs [][]float32) (*pb.PushResponse, error)
}

// Shard is one PS connection.
type Shard struct {
	Addr   string
	Client DataPlane
}

// Config is everything a worker needs; all dependencies are passed in.
type Config struct {
	Index   int
	RunID   string
	Run     config.Run
	Plan    partition.Plan
	Net     *nn.Net // built for Run.Batch with gradients
	Shards  []Shard
	Batches BatchSource
	Log     *slog.Logger
	Metrics *metrics.Worker // nil: not recorded
	// RetryTimeout bounds how long an unavailable shard is retried.
	RetryTimeout time.Duration
	// BeforePush, if set, is called before each push with the step about to
	// be pushed (tests use it to observe and to slow a worker down).
	BeforePush func(step int64)
	// AfterPull, if set, is called when a step's pulls have returned.
	AfterPull func(step int64)
}

// Worker runs the loop.
type Worker struct {
	cfg      Config
	flat     [][]float32 // per-shard gradient gather buffers (float32 pushes), else nil
	half     [][]byte    // per-shard bfloat16 push buffers (--wire-dtype bf16), else nil
	step     int64
	lastLoss float32
	mu       sync.Mutex // guards step, lastLoss for Progress
}

// New checks the configuration and allocates the buffers.
func New(cfg Config) (*Worker, error) {
	if len(cfg.Shards) != len(cfg.Plan.Shards) {
		return nil, fmt.Errorf("worker: %d shard connections for a plan of %d shards", len(cfg.Shards), len(cfg.Plan.Shards))
	}
	if cfg.Net == nil || cfg.Batches == nil || cfg.Log == nil {
		return nil, errors.New("worker: Net, Batches and Log are required")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewWorker(nil)
	}
	if cfg.RetryTimeout <= 0 {
		cfg.RetryTimeout = time.Minute
	}
	w := &Worker{cfg: cfg}
	for _, s := range cfg.Plan.Shards {
		if cfg.Run.WireDType == "bf16" {
			w.half = append(w.half, make([]byte, 2*s.Size))
		} else {
			w.flat = append(w.flat, make([]float32, s.Size))
		}
	}
	return w, nil
}

// Progress returns the number of steps done and the last loss.
func (w *Worker) Progress() (int64, float32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.step, w.lastLoss
}

// Run trains until training is done (nil), ctx ends (ctx.Err()) or a shard
// stays unreachable past RetryTimeout.
func (w *Worker) Run(ctx context.Context) error {
	c := w.cfg
	n := len(c.Shards)
	var minVersion int64          // sync: the version every shard must reach
	versions := make([]int64, n)  // version of the parameters in the net, per shard
	gens := make([]int64, n)      // the chief's generation of each shard's state
	positions := make([]int64, n) // this worker's data position on each shard
	next := int64(-1)             // the position Batches is at (-1: not yet known)
	x := c.Net.Input()
	y := make([]uint8, c.Net.Batch())
	errs := make([]error, n)
	var wg sync.WaitGroup
	for {
		t0 := time.Now()
		finished, err := w.pullAll(ctx, minVersion, versions, gens, positions)
		if err != nil {
			return err
		}
		if finished {
			c.Log.Info("training done", "worker", c.Index, "steps", w.step)
			return nil
		}
		if c.AfterPull != nil {
			c.AfterPull(w.step)
		}
		t1 := time.Now()
		c.Metrics.ObservePhase(metrics.PhasePull, t1.Sub(t0))

		// The batch at the data position: one past the furthest batch of
		// this worker's that some shard holds.
		if pos := slices.Max(positions); pos != next {
			switch {
			case next < 0:
				c.Log.Info("data position", "worker", c.Index, "batch", pos)
			case pos == next-1:
				// No shard counted the last gradient (stale everywhere,
				// e.g. a backup worker's that lost the race): no sample
				// of it is in the model yet.
				c.Log.Debug("gradient not counted; using its batch again", "worker", c.Index, "batch", pos)
			default:
				c.Log.Warn("data position moved by the parameter servers (a rollback to a checkpoint?)", "worker", c.Index, "from", next, "to", pos)
			}
			c.Batches.SeekBatch(pos)
			next = pos
		}

		// Forward and backward.
		c.Batches.Next(x, y)
		next++
		c.Net.SetLabels(y)
		loss, err := c.Net.Step()
		if err != nil {
			return err
		}
		grads, err := c.Net.Grads()
		if err != nil {
			return err
		}
		t2 := time.Now()
		c.Metrics.ObservePhase(metrics.PhaseCompute, t2.Sub(t1))

		// Push each shard its slice, in parallel.
		if c.BeforePush != nil {
			c.BeforePush(w.step)
		}
		for s := range c.Shards {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := &pb.PushRequest{Worker: int32(c.Index), Version: versions[s], RunId: c.RunID, Loss: loss, Generation: gens[s],
					DataPosition: next} // the batch's position + 1
				push := func() error { _, err := c.Shards[s].Client.Push(ctx, req); return err }
				sp, segmented := c.Shards[s].Client.(SegmentedDataPlane)
				switch {
				case w.half != nil:
					// Rounded straight from the model's gradients.
					off := 0
					for _, seg := range c.Plan.Segments(s, grads) {
						wire.PutBF16(w.half[s][off:], seg)
						off += 2 * len(seg)
					}
					req.Grad = w.half[s]
				case segmented:
					segs := c.Plan.Segments(s, grads)
					push = func() error { _, err := sp.PushSegments(ctx, req, segs); return err }
				default:
					c.Plan.Gather(s, grads, w.flat[s])
					req.Grad = wire.Bytes(w.flat[s])
				}
				errs[s] = w.retry(ctx, s, "push", push)
				bytes := 4 * c.Plan.Shards[s].Size
				if w.half != nil {
					bytes = len(w.half[s])
				}
				c.Metrics.RPCSentBytes.WithLabelValues("push").Add(float64(bytes))
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		c.Metrics.ObservePhase(metrics.PhasePush, time.Since(t2))
		if c.Run.Mode == config.Sync {
			minVersion = versions[0] + 1 // pullAll made them equal
		}
		w.mu.Lock()
		w.step++
		w.lastLoss = loss
		w.mu.Unlock()
		c.Metrics.Steps.Inc()
		c.Metrics.Samples.Add(float64(c.Net.Batch()))
		c.Metrics.TrainLoss.Set(float64(loss))
	}
}

// pullAll pulls every shard in parallel, straight into the net's weights,
// and records each shard's version. It reports true when training is done.
//
// In sync mode the step's parameters must come from one version on every
// shard, or the gradient would mix two models: shards that answer with an
// older version than another shard are pulled again at the highest version
// seen. That also bounds the skew between shards to one step: a shard can
// only reach v+1 from gradients tagged v on every shard, and those
// gradients are pushed to every shard.
//
// A shard that says done ends the other pulls: with backup workers the
// shards aggregate independently, so another shard may be waiting for a
// step no worker will complete.
//
// gens holds each shard's generation, which the chief bumps when it
// re-initialises the state (a rollback to a checkpoint after a PS
// restart). A pull from an older generation answers at once with the new
// state. In sync mode the chief rolls every shard back together, so the
// step waits until every shard is in the newest generation seen: a shard
// still in an older one is pulled with an unreachable minimum version,
// which returns as soon as its generation changes.
func (w *Worker) pullAll(ctx context.Context, minVersion int64, versions, gens, positions []int64) (bool, error) {
	c := w.cfg
	n := len(c.Shards)
	errs := make([]error, n)
	done := make([]bool, n)
	todo := make([]bool, n)
	want := make([]int64, n)
	for s := range todo {
		todo[s] = true
		want[s] = minVersion
	}
	for {
		pullCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for s := range c.Shards {
			if !todo[s] {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := w.pull(pullCtx, s, want[s], gens[s])
				if err == nil {
					var p []float32
					if resp.Params != nil { // else read straight into the net's parameters
						p, err = wire.Floats(resp.Params)
						if err == nil && len(p) != c.Plan.Shards[s].Size {
							err = fmt.Errorf("shard %d (%s) sent %d parameters, plan says %d", s, c.Shards[s].Addr, len(p), c.Plan.Shards[s].Size)
						}
					}
					if err == nil {
						if p != nil {
							c.Plan.Scatter(s, p, c.Net.Params())
						}
						if resp.Generation != gens[s] && gens[s] != 0 {
							c.Log.Warn("parameter server state replaced by the chief", "ps", s, "generation", resp.Generation, "version", resp.Version)
						}
						versions[s], done[s], gens[s] = resp.Version, resp.Done, resp.Generation
						positions[s] = resp.DataPosition
						c.Metrics.RPCReceivedBytes.WithLabelValues("pull").Add(float64(4 * c.Plan.Shards[s].Size))
						if resp.Done {
							cancel()
						}
					}
				}
				errs[s] = err
			}()
		}
		wg.Wait()
		cancel()
		for _, d := range done {
			if d {
				return true, nil
			}
		}
		if err := errors.Join(errs...); err != nil {
			return false, err
		}
		if c.Run.Mode != config.Sync {
			return false, nil
		}
		g := slices.Max(gens)
		hi := int64(-1)
		for s, v := range versions {
			if gens[s] == g {
				hi = max(hi, v)
			}
		}
		again := false
		for s, v := range versions {
			switch {
			case gens[s] < g:
				todo[s], want[s] = true, math.MaxInt64
			case v < hi:
				todo[s], want[s] = true, hi
			default:
				todo[s] = false
			}
			again = again || todo[s]
		}
		if !again {
			return false, nil
		}
	}
}

func (w *Worker) pull(ctx context.Context, s int, minVersion, gen int64) (*pb.PullResponse, error) {
	var resp *pb.PullResponse
	err := w.retry(ctx, s, "pull", func() error {
		var err error
		req := &pb.PullRequest{Worker: int32(w.cfg.Index), MinVersion: minVersion, RunId: w.cfg.RunID, Generation: gen}
		if sp, ok := w.cfg.Shards[s].Client.(SegmentedDataPlane); ok {
			resp, err = sp.PullInto(ctx, req, w.cfg.Plan.Segments(s, w.cfg.Net.Params()))
		} else {
			resp, err = w.cfg.Shards[s].Client.Pull(ctx, req)
		}
		if status.Code(err) == codes.Unavailable {
			// The shard may have restarted from an older checkpoint: after
			// an outage take whatever version it has.
			minVersion = 0
		}
		return err
	})
	return resp, err
}

// retry calls f until it succeeds, fails with a non-retryable error, or
// the shard has been unavailable for RetryTimeout.
func (w *Worker) retry(ctx context.Context, s int, op string, f func() error) error {
	addr := w.cfg.Shards[s].Addr
	err := retry.Do(ctx, retry.Policy{First: 20 * time.Millisecond, Max: time.Second, Patience: w.cfg.RetryTimeout,
		Retryable: retry.OnCodes(codes.Unavailable),
		OnRetry: func(attempt int, err error) {
			if attempt == 1 {
				w.cfg.Log.Warn("parameter server unavailable, retrying", "ps", s, "addr", addr, "op", op, "err", status.Convert(err).Message())
			}
			w.cfg.Metrics.Retries.Inc()
		}}, func(context.Context) error { return f() })
	var gaveUp *retry.GaveUpError
	switch {
	case err == nil || err == ctx.Err():
		return err
	case errors.As(err, &gaveUp):
		return fmt.Errorf("%s to ps/%d at %s: unavailable for %v, giving up: %w", op, s, addr, gaveUp.After.Round(time.Millisecond), gaveUp.Err)
	}
	return fmt.Errorf("%s to ps/%d at %s: %w", op, s, addr, err)
}
