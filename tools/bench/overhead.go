package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/optim"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/worker"
)

// OverheadConfig says what the ps_overhead section measures.
type OverheadConfig struct {
	Spec   model.Spec
	Batch  int
	Budget time.Duration // per measurement and round
	Rounds int           // alternating in-process/PS rounds; the best of each counts
	Seed   uint64
	Now    Clock
	// DataPlane is the path measured: config.TCP (the default) or config.GRPC.
	DataPlane config.DataPlane
}

// OverheadResult is the ps_overhead section: samples/s of one worker
// training against 1 PS over loopback gRPC (sync, momentum, as the default
// cluster) over samples/s of the same model trained in-process with the
// same optimizer applied locally. The per-step split comes from the
// worker's hooks: compute is batch+forward+backward, comm is push plus
// the next pull (including the PS update).
type OverheadResult struct {
	DataPlane                 string  `json:"data_plane"`
	Batch                     int     `json:"batch"`
	Mode                      string  `json:"mode"`
	Ratio                     float64 `json:"ratio"`
	PSSamplesPerSecond        float64 `json:"ps_samples_per_second"`
	InProcessSamplesPerSecond float64 `json:"inprocess_samples_per_second"`
	InProcessMsPerStep        float64 `json:"inprocess_ms_per_step"`
	PSMsPerStep               float64 `json:"ps_ms_per_step"`
	PSComputeMsPerStep        float64 `json:"ps_compute_ms_per_step"`
	PSCommunicationMsPerStep  float64 `json:"ps_communication_ms_per_step"`
}

// Overhead measures the PS overhead ratio.
func Overhead(ctx context.Context, c OverheadConfig) (*OverheadResult, error) {
	if err := checkDurations(c.Budget, c.Rounds); err != nil {
		return nil, err
	}
	if c.Batch <= 0 {
		return nil, fmt.Errorf("bench: batch must be positive, got %d", c.Batch)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	run := pairRun(c.Spec, c.Batch, c.Seed)
	if c.DataPlane != "" {
		run.DataPlane = c.DataPlane
	}
	data := newSynthBatches(c.Spec, 2048, c.Seed)

	net, err := nn.New(c.Spec, c.Batch, true)
	if err != nil {
		return nil, err
	}
	defer net.Close()
	cl, err := startTCPCluster(ctx, run, c.Spec, 0)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	local, err := newLocalTrainer(net, c.Spec, run, data)
	if err != nil {
		return nil, err
	}
	if err := local.step(); err != nil { // warm-up
		return nil, err
	}
	var localRate best
	var psBest psRound
	for range c.Rounds {
		k, d, err := loop(ctx, c.Now, c.Budget, 3, local.step)
		if err != nil {
			return nil, fmt.Errorf("bench: in-process training: %w", err)
		}
		localRate.add(rate(float64(k), d))
		r, err := psSteps(ctx, c.Now, cl, run, net, data, c.Budget)
		if err != nil {
			return nil, err
		}
		if r.stepsPerSec() > psBest.stepsPerSec() {
			psBest = r
		}
	}
	o := overheadFigures(c.Batch, string(run.Mode), float64(localRate), psBest)
	o.DataPlane = string(run.DataPlane)
	return o, nil
}

// psRound is what one timed run of a PS-backed worker saw: steps, their
// total time and the part of it spent computing.
type psRound struct {
	steps   int
	total   time.Duration
	compute time.Duration
}

func (r psRound) stepsPerSec() float64 { return rate(float64(r.steps), r.total) }

func overheadFigures(batch int, mode string, localStepsPerSec float64, r psRound) *OverheadResult {
	o := &OverheadResult{Batch: batch, Mode: mode,
		InProcessSamplesPerSecond: localStepsPerSec * float64(batch),
		PSSamplesPerSecond:        r.stepsPerSec() * float64(batch),
	}
	o.Ratio = ratio(o.PSSamplesPerSecond, o.InProcessSamplesPerSecond)
	if localStepsPerSec > 0 {
		o.InProcessMsPerStep = 1e3 / localStepsPerSec
	}
	if r.steps > 0 {
		o.PSMsPerStep = r.total.Seconds() * 1e3 / float64(r.steps)
		o.PSComputeMsPerStep = r.compute.Seconds() * 1e3 / float64(r.steps)
		o.PSCommunicationMsPerStep = o.PSMsPerStep - o.PSComputeMsPerStep
	}
	return o
}

// psSteps runs a worker against the cluster until budget has passed since
// its first step's pull returned, then stops it through its context. Only
// whole steps between the first and the last observed pull are counted,
// so connection set-up is excluded.
func psSteps(parent context.Context, now Clock, cl *tcpCluster, run config.Run, net *nn.Net, data *synthBatches, budget time.Duration) (psRound, error) {
	return psStepsWith(parent, now, cl, run, net, data, psWindow{budget: budget})
}

// psWindow is when a round of psStepsWith stops and what its worker
// records.
type psWindow struct {
	budget time.Duration
	// until, when set, must also hold before the round stops: the round
	// goes on past its budget until it does.
	until   func() bool
	metrics *metrics.Worker // nil: unregistered
}

// ends reports whether a round that has run for elapsed may stop.
func (w psWindow) ends(elapsed time.Duration) bool {
	return elapsed >= w.budget && (w.until == nil || w.until())
}

// psStepsWith is psSteps with the window in win.
func psStepsWith(parent context.Context, now Clock, cl *tcpCluster, run config.Run, net *nn.Net, data *synthBatches, win psWindow) (psRound, error) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var (
		first, lastPull, computeStart time.Time
		firstStep, lastStep           int64 = -1, -1
		compute                       time.Duration
	)
	cfg := worker.Config{Index: 0, RunID: "bench", Run: run, Plan: cl.plan, Net: net, Shards: cl.shards,
		Batches: data, Log: slog.New(slog.DiscardHandler), RetryTimeout: 10 * time.Second, Metrics: win.metrics,
		AfterPull: func(step int64) {
			t := now()
			computeStart = t
			if firstStep < 0 {
				first, firstStep = t, step
				return
			}
			lastPull, lastStep = t, step
			if lastStep-firstStep >= 3 && win.ends(t.Sub(first)) {
				cancel()
			}
		},
		BeforePush: func(step int64) {
			// Steps firstStep..lastStep-1 are in the window; the step
			// computed after cancel() is not.
			if firstStep >= 0 && ctx.Err() == nil {
				compute += now().Sub(computeStart)
			}
		},
	}
	w, err := worker.New(cfg)
	if err != nil {
		return psRound{}, err
	}
	err = w.Run(ctx)
	if perr := parent.Err(); perr != nil {
		return psRound{}, perr
	}
	if !errors.Is(err, context.Canceled) {
		if err == nil {
			err = errors.New("training ended before the measurement did")
		}
		return psRound{}, fmt.Errorf("bench: PS-backed worker: %w", err)
	}
	steps := int(lastStep - firstStep)
	if steps <= 0 {
		return psRound{}, errors.New("bench: PS-backed worker made no whole step")
	}
	return psRound{steps: steps, total: lastPull.Sub(first), compute: compute}, nil
}

// localTrainer is the no-PS baseline: the same net, batches and optimizer
// (one per variable), updated in place.
type localTrainer struct {
	net  *nn.Net
	data *synthBatches
	y    []uint8
	opts []optim.Optimizer
}

func newLocalTrainer(net *nn.Net, spec model.Spec, run config.Run, data *synthBatches) (*localTrainer, error) {
	t := &localTrainer{net: net, data: data, y: make([]uint8, net.Batch())}
	init := spec.Init(uint64(run.Seed))
	for i, v := range spec.Variables() {
		o, err := optim.New(optim.Config{Name: run.Optimizer, LR: run.LR, Momentum: run.Momentum}, v.Size())
		if err != nil {
			return nil, err
		}
		t.opts = append(t.opts, o)
		copy(net.Params()[i], init[i])
	}
	return t, nil
}

func (t *localTrainer) step() error {
	t.data.Next(t.net.Input(), t.y)
	t.net.SetLabels(t.y)
	if _, err := t.net.Step(); err != nil {
		return err
	}
	grads, err := t.net.Grads()
	if err != nil {
		return err
	}
	for i, g := range grads {
		t.opts[i].Apply(t.net.Params()[i], g, 1)
	}
	return nil
}

// synthBatches cycles through a fixed pool of random samples. Throughput
// does not depend on the values, and a pool avoids loading MNIST.
type synthBatches struct {
	x    []float32
	y    []uint8
	in   int
	next int
	seek int64 // the batch SeekBatch asked for, -1 if none
}

func newSynthBatches(spec model.Spec, n int, seed uint64) *synthBatches {
	r := rand.New(rand.NewPCG(seed, 2))
	s := &synthBatches{x: make([]float32, n*spec.Input), y: make([]uint8, n), in: spec.Input, seek: -1}
	for i := range s.x {
		s.x[i] = r.Float32()
	}
	for i := range s.y {
		s.y[i] = uint8(r.IntN(spec.Classes))
	}
	return s
}

// Next implements worker.BatchSource: batch p is the pool's samples from
// p*batch on, wrapping around.
func (s *synthBatches) Next(x []float32, y []uint8) {
	if s.seek >= 0 {
		s.next = int(s.seek * int64(len(y)) % int64(len(s.y)))
		s.seek = -1
	}
	for r := range y {
		i := s.next
		copy(x[r*s.in:(r+1)*s.in], s.x[i*s.in:(i+1)*s.in])
		y[r] = s.y[i]
		s.next = (s.next + 1) % len(s.y)
	}
}

// SeekBatch implements worker.BatchSource.
func (s *synthBatches) SeekBatch(p int64) { s.seek = p }

// pairRun is the run of the 1 PS + 1 worker sections: sync, on the TCP
// plane, with a small step: random inputs have a larger norm than MNIST,
// and 0.01 keeps them finite for any number of steps (speed does not
// depend on it).
func pairRun(spec model.Spec, batch int, seed uint64) config.Run {
	run := config.Default()
	run.PS, run.Workers, run.Batch, run.Mode, run.Seed = 1, 1, batch, config.Sync, int64(seed)
	run.Hidden, run.DataPlane, run.LR = spec.Hidden, config.TCP, 0.01
	run.Model, run.Conv = config.ModelKind(spec.Kind), spec.Conv
	return run
}
