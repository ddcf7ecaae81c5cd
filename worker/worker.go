package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
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

// ViewingDataPlane is a DataPlane that can leave a pull's parameters
// where they arrived (dataplane.Client.PullView): in a region shared
// with a same-host PS, valid until the client's next call. The net then
// reads them there (nn.Net.ReadFrom, inplace_reads.go): no copy into its
// weights.
type ViewingDataPlane interface {
	PullView(ctx context.Context, in *pb.PullRequest, dst [][]float32) (*pb.PullResponse, error)
}

// Shard is one PS connection.
type Shard struct {
	Addr   string
	Client DataPlane
	// Puller, if set, is a second client of the same process for the
	// shard's pulls, so that in sync mode the next step's pull can wait
	// at the shard while this step's push is under way
	// (CoreParams.Overlap), and so that the net can read a pull's answer
	// in place until the next pull (inplace_reads.go). nil: pulls use
	// Client, after the push is answered.
	Puller DataPlane
}

// puller is the client the shard's pulls use.
func (sh Shard) puller() DataPlane {
	if sh.Puller != nil {
		return sh.Puller
	}
	return sh.Client
}

// Config is everything a worker needs; all dependencies are passed in.
type Config struct {
	Index   int
	RunID   string
	Run     config.Run
	Plan    partition.Plan
	Net     Net // built for Run.Batch with gradients (nn.Net, CTRNet)
	Shards  []Shard
	Batches BatchSource
	Log     *slog.Logger
	Metrics *metrics.Worker // nil: not recorded
	// RetryTimeout bounds how long an unavailable shard is retried.
	RetryTimeout time.Duration
	// BeforePush, if set, is called before each push with the step about to
	// be pushed (tests use it to observe and to slow a worker down). A
	// worker with it pushes no shard early (early_push.go).
	BeforePush func(step int64)
	// AfterPull, if set, is called when a step's pulls have returned.
	AfterPull func(step int64)
	// CatchUpAfter is how long a sync worker waits for a shard behind the
	// others before it pushes it a catch-up gradient (ps.Align); 0:
	// ps.CatchUpAfter.
	CatchUpAfter time.Duration
	// Faults poison this worker's gradients (tests: --fault-gradient);
	// those of other workers are ignored.
	Faults []GradientFault
	// DataPlan, if set, follows the chief's data plan (Batches under an
	// elastic run's plan; see Heartbeats).
	DataPlan PlanFollower
	// Layout, if set, follows a change of the run's PS count (see
	// Heartbeats).
	Layout LayoutFollower
	// Clock gives the time the core's events carry (the phases' lengths);
	// nil: the system clock.
	Clock Clock
}

// Clock is where a worker reads the time.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Worker is the driver around a Core: it carries out the core's actions
// (the pulls and pushes on the data plane, the passes on the net, the
// moves of the batch source) and feeds it their outcomes.
type Worker struct {
	cfg    Config
	params CoreParams
	flat   [][]float32 // per-shard gradient gather buffers (float32 pushes), else nil
	half   [][]byte    // per-shard bfloat16 push buffers (--wire-dtype bf16), else nil
	comp   *compressor // --compress's residuals and buffers, else nil
	wire   wireCounts
	labels []uint8 // the batch's labels
	// inPlace says, by shard, that the net reads its parameters where its
	// pulls leave them (inplace_reads.go); regions are where, by shard
	// (nil: its weights).
	inPlace []bool
	regions [][]float32
	run     *run // the Run under way (the net's early announcements go to its core)

	mu       sync.Mutex // guards step, lastLoss for Progress
	step     int64
	lastLoss float32
	early    atomic.Int64 // shards pushed early
	ahead    atomic.Int64 // steps started ahead
}

// New checks the configuration, allocates the buffers and works out
// which of the core's states the worker uses (CoreParams): early pushes
// and steps started ahead (sync, a net that announces row blocks, a
// plan with shards to push early, no gradient fault and no BeforePush
// hook, which is promised every push), in-place reads (pulls on clients
// of their own that can leave them in place) and the next step's pulls
// sent with a step's pushes (sync, pulls on clients of their own).
func New(cfg Config) (*Worker, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, labels: make([]uint8, cfg.Net.Batch()), regions: make([][]float32, len(cfg.Shards))}
	w.comp = newCompressor(cfg.Run.CompressSetting(), cfg.Plan)
	for _, s := range cfg.Plan.Shards {
		switch {
		case w.comp.pushes():
		case cfg.Run.WireDType == config.BF16:
			w.half = append(w.half, make([]byte, 2*s.Size))
		default:
			w.flat = append(w.flat, make([]float32, s.Size))
		}
	}
	w.params = w.coreParams()
	return w, nil
}

// withDefaults checks cfg and fills in its defaults.
func withDefaults(cfg Config) (Config, error) {
	if len(cfg.Shards) != len(cfg.Plan.Shards) {
		return cfg, fmt.Errorf("worker: %d shard connections for a plan of %d shards", len(cfg.Shards), len(cfg.Plan.Shards))
	}
	if cfg.Net == nil || cfg.Batches == nil || cfg.Log == nil {
		return cfg, errors.New("worker: Net, Batches and Log are required")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.NewWorker(nil)
	}
	if cfg.RetryTimeout <= 0 {
		cfg.RetryTimeout = time.Minute
	}
	if cfg.CatchUpAfter <= 0 {
		cfg.CatchUpAfter = ps.CatchUpAfter
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	return cfg, nil
}

// coreParams works out the core's parameters (see New) and sets the net
// up for them.
func (w *Worker) coreParams() CoreParams {
	cfg := w.cfg
	syncMode := cfg.Run.Mode == config.Sync
	p := CoreParams{Index: cfg.Index, Mode: cfg.Run.Mode, Shards: len(cfg.Shards), Overlap: syncMode && w.pullersApart()}
	for _, f := range cfg.Faults {
		if f.Worker == cfg.Index {
			p.Faults = append(p.Faults, f)
		}
	}
	rows, ready := earlyPlan(cfg.Plan)
	if syncMode && len(rows) > 0 && len(p.Faults) == 0 && cfg.BeforePush == nil && cfg.Net.SetEarlyRows(rows, w.rowsFinal) {
		p.EarlyRows, p.EarlyReady = rows, ready
		p.HeadStart = headStartPlan(cfg.Plan, rows)
	}
	w.inPlace = w.inPlacePlan()
	p.InPlace = w.inPlace
	return p
}

// Progress returns the number of steps done and the last loss.
func (w *Worker) Progress() (int64, float32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.step, w.lastLoss
}

// EarlyPushes is how many shard pushes the worker has started early,
// before its step's backward pass ended, answered or not (0 if it sends
// none early).
func (w *Worker) EarlyPushes() int64 { return w.early.Load() }

// AheadSteps is how many steps the worker started ahead: part of the
// forward pass computed from the shards that answered first, and used.
func (w *Worker) AheadSteps() int64 { return w.ahead.Load() }

// pullersApart says every shard's pulls have a client of their own
// (Shard.Puller), so a pull can be under way while a push is.
func (w *Worker) pullersApart() bool {
	for _, sh := range w.cfg.Shards {
		if sh.Puller == nil {
			return false
		}
	}
	return len(w.cfg.Shards) > 0
}

// Run trains until training is done (nil), ctx ends (ctx.Err()) or a shard
// stays unreachable past RetryTimeout. It carries out a new Core's
// actions and feeds it their outcomes; the pulls and pushes run on
// goroutines of their own and report on a channel, everything else
// (the core, the net, the batch source) on the calling goroutine. Every
// call it starts has been answered when it returns.
func (w *Worker) Run(ctx context.Context) error { return w.RunStoppable(ctx, nil) }

// RunStoppable is Run that also ends, with an error, when stop is done
// (nil: never), but more gently than when ctx is: the pulls under way
// (a ViewStepper's reads among them) are cut short, while the pushes
// under way (a ViewStepper's writes among them) are answered (only ctx
// cuts them), so that a step's gradient has reached every shard it was
// sent to when it returns. A change of the PS count stops
// a worker so (docs/elastic.md, "Parameter servers": in async and ssp
// runs the shards are snapshotted once every worker has stopped).
func (w *Worker) RunStoppable(ctx, stop context.Context) error {
	pushCtx := ctx
	if stop != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(stop, cancel)()
	}
	r := &run{w: w, ctx: ctx, pushCtx: pushCtx, core: NewCore(w.params, w.cfg.Log), events: make(chan event, 2*len(w.cfg.Shards))}
	w.run = r
	defer func() { w.run = nil }()
	defer w.logUnsent()
	defer r.cancelRound()
	acts := r.core.Start(w.cfg.Clock.Now())
	for {
		done, err := r.perform(acts)
		if done {
			return err
		}
		if r.calls == 0 {
			return errors.New("worker: internal error: the core waits for nothing")
		}
		acts = r.deliver(<-r.events)
	}
}
