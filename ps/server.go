package ps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"

	"github.com/pstrain/pstrain/ml/optim"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/compress"
	"github.com/pstrain/pstrain/transport/wire"
)

// Server serves one shard over gRPC.
type Server struct {
	pb.UnimplementedParameterServerServer

	log *slog.Logger
	m   *metrics.PS
	now func() time.Time // the clock (Config.Now)
	// mirror takes the per-gradient series (staleness, norm ratios,
	// refused and dropped gradients, rejected pushes) while the process
	// is a standby: its pushes are its primary's, counted there, and a
	// sum over PS processes must not count them twice. Never exported.
	mirror   *metrics.PS
	shutdown func() // called after a Stop with shutdown set

	mu      sync.Mutex
	shard   *Shard // nil until Init
	runID   string
	index   int
	changed chan struct{} // closed and replaced whenever a pull may become ready
	// snap is the newest pull snapshot made (nil until a push that
	// completes a step writes one, or a pull asks for one), current if
	// its version is the shard's; spares are retired ones kept for reuse
	// (at most maxSpareSnaps).
	snap     *pullSnap
	spares   []*pullSnap
	snapBufs SnapshotBuffers // where new snapshots are kept (nil: the heap)
	lastLoss float32

	// gen is the chief's generation of the shard's state (see Init).
	gen       int64
	numShards int
	plan      partition.Plan // the run's partition, for checkpoint tensor names
	// opts are the run's options as the last Init gave them, set with
	// shard. With --wire-dtype bf16 pushes are widened into wide, reused
	// from push to push.
	opts Options
	wide []float32
	// mirrors answer compressed pulls (--compress; compress.go).
	mirrors pullMirrors
	// store receives checkpoints (nil: this PS has no checkpoint dir).
	store *checkpoint.Store
	// pending are checkpoint requests waiting for their version.
	pending []*pendingSnap
	// retained is the state the last pull with retain set kept (the
	// model the chief evaluated), nil if none since Init.
	retained *retainedSnap
	// window is the attribution window the last chief's pull closed
	// (Status reports it).
	window Window
	// dataAddr is the TCP data plane's address ("" = none).
	dataAddr string
	// refusals rate-limits the log lines of refused gradients;
	// guardLogged says the stop's summary of them was logged.
	refusals    refusalLog
	guardLogged bool

	// Hot standby (docs/replication.md; replica.go). shardIndex is this
	// process's shard (ps/N or standby/N; -1: not told), dial how it
	// reaches its standby. role and epoch are the process's place in the
	// shard's replication; lastInit the request of the Init that made the
	// state, without its payloads (a snapshot's template); rep the link to
	// the standby of a primary that has one; linkEpoch and linkSeq the
	// epoch of the last link a primary stopped and the last number it
	// used (a new link of that epoch numbers on from there); replSeq a
	// standby's last applied operation.
	shardIndex int
	dial       ReplicaDialer
	role       string
	epoch      int64
	lastInit   *pb.InitRequest
	rep        *replicator
	linkEpoch  int64
	linkSeq    int64
	replSeq    int64
	// told are the workers a pull or push answer told training is done
	// (Drained).
	told []bool

	// tables are the shard's embedding tables, under their own lock
	// (tablesrv.go).
	tables *tableHost
}

// refusalLog rate-limits the log of refused gradients: the first one, then
// at most one line every refusalLogEvery, which counts those not logged.
type refusalLog struct {
	last     time.Time
	unlogged int
}

const refusalLogEvery = 10 * time.Second

// due reports whether a refusal at now is logged, and how many earlier
// ones were not.
func (r *refusalLog) due(now time.Time) (bool, int) {
	if !r.last.IsZero() && now.Sub(r.last) < refusalLogEvery {
		r.unlogged++
		return false, 0
	}
	n := r.unlogged
	r.last, r.unlogged = now, 0
	return true, n
}

// pullSnap is the byte encoding of the parameters at one version, shared
// read-only by every pull of that version, so a pull never copies under
// the lock. The data plane holds a reference while it writes a snapshot
// to a socket; one that nobody reads any more is reused for a later
// version rather than left to the garbage collector. The PS then
// allocates nothing per step and its heap stays near its live size
// (docs/scaling.md, "Memory").
type pullSnap struct {
	b       []byte
	version int64
	readers int  // data plane pulls writing it, checkpoints saving it, the retained state
	escaped bool // handed to gRPC, which never says when it is done: not reused
	// lender lent b (SnapshotBuffers), which gets it back when the
	// snapshot is dropped; nil: b is the heap's. A lent b never escapes.
	lender SnapshotBuffers
}

// SnapshotBuffers lends a server the memory of its pull snapshots: the
// data plane's shared snapshot region (dataplane.Server.SnapshotBuffers),
// so that the data plane answers a same-host pull from the snapshot
// itself instead of copying it into a slot. Lend false: none to lend
// (the server allocates its own).
type SnapshotBuffers interface {
	Lend(n int) ([]byte, bool)
	Return(b []byte)
}

// snapshot is an in-memory copy of the shard's state, with what names it.
// Its parameters are the version's pull snapshot (held: release it).
type snapshot struct {
	version   int64
	params    []float32
	held      *pullSnap
	opt       []float32
	optSteps  int64
	positions []int64       // the workers' data positions (Shard.DataPositions)
	pause     time.Duration // how long the copy held the lock
	plan      partition.Plan
	index     int
	numShards int
	optName   string
	runID     string
	tables    []TableSlots // the embedding tables' slots (frozen views)
}

// retainedSnap is the state a pull with retain set kept: its parameters
// are that pull's snapshot, held until the next retain or Init replaces
// it; its optimizer state and positions are copies into buffers that the
// next retain reuses, unless a checkpoint is still writing them.
type retainedSnap struct {
	snapshot
	writers int // checkpoints writing it
}

// pendingSnap is a checkpoint request waiting for the shard to reach at.
// ch receives the snapshot, or is closed if the version is never reached
// (training stopped, or the state was replaced by Init).
type pendingSnap struct {
	at int64
	ch chan snapshot
}

// Config is everything a Server depends on, given once at NewServer.
type Config struct {
	Log     *slog.Logger
	Metrics *metrics.PS // nil: counted nowhere
	// Shard is the shard this process serves (ps/N and standby/N serve
	// shard N): an Init or a replica batch for another shard is refused.
	// AnyShard: a server bound to none.
	Shard int
	// DataAddr is the address of the TCP data plane serving this shard,
	// which Status reports to workers ("": none).
	DataAddr string
	// Store is where the Checkpoint RPC writes (nil: it is refused).
	Store *checkpoint.Store
	// Dial is how a primary reaches its standby (nil: it cannot attach
	// one).
	Dial ReplicaDialer
	// Shutdown is called when the chief orders the process to exit (nil:
	// nothing happens).
	Shutdown func()
	// Now is the server's clock: request durations, checkpoint pauses,
	// the standby link's lag (nil: time.Now).
	Now func() time.Time
}

// AnyShard is Config.Shard for a server not bound to one shard.
const AnyShard = -1

// NewServer returns an uninitialised shard server built from cfg.
func NewServer(cfg Config) *Server {
	m, shutdown, now := cfg.Metrics, cfg.Shutdown, cfg.Now
	if m == nil {
		m = metrics.NewPS(nil)
	}
	if shutdown == nil {
		shutdown = func() {}
	}
	if now == nil {
		now = time.Now
	}
	s := &Server{now: now, log: cfg.Log, m: m, mirror: metrics.NewPS(nil), shutdown: shutdown, changed: make(chan struct{}), index: -1,
		shardIndex: cfg.Shard, dataAddr: cfg.DataAddr, store: cfg.Store, dial: cfg.Dial, tables: newTableHost(m.Tables)}
	s.setRole(roleNone)
	return s
}

// notify wakes every blocked pull so it re-checks readiness. Call with mu.
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Server) observe(op string, start time.Time) {
	s.m.Requests.WithLabelValues(op).Inc()
	s.m.RequestDuration.WithLabelValues(op).Observe(s.now().Sub(start).Seconds())
}

// Init replaces the shard's state.
func (s *Server) Init(ctx context.Context, req *pb.InitRequest) (*pb.InitResponse, error) {
	defer s.observe("init", s.now())
	b, err := s.build(req)
	if err == nil {
		b.ts, err = buildTables(ctx, req, b.opts.Mode)
	}
	if err != nil {
		return nil, err
	}
	kept, tables, err := s.initLocked(req, b)
	if err != nil {
		return nil, err
	}
	resp := &pb.InitResponse{RowsKept: kept}
	if req.RowsFromCheckpoint != nil && req.RowsLoading && tables != nil {
		step := req.GetRowsFromCheckpoint()
		n, err := s.tables.loadFromCheckpoint(ctx, s.store, step, int(req.Shard), int(req.NumShards), kept, tables)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "loading the shard's rows from the checkpoint of step %d: %v", step, err)
		}
		resp.RowsLoaded = n
		s.log.Info("rows loaded from the checkpoint", "step", step, "rows", n)
		s.rowsLoaded()
	}
	return resp, nil
}

// initLocked is Init's work under the server's lock: the shard b
// replaces the one before, and its tables (keeping the rows it holds,
// when asked and able), which it returns (nil: none): another Init
// replaces them only once this one released the lock.
func (s *Server) initLocked(req *pb.InitRequest, b built) (kept bool, tables *TableSet, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shardIndex >= 0 && int(req.Shard) != s.shardIndex {
		return false, nil, status.Errorf(codes.InvalidArgument, "init of shard %d: this process serves shard %d", req.Shard, s.shardIndex)
	}
	// Any Init makes the process its shard's primary (first: a former
	// standby's tables export their counters from this Init on); with a
	// standby address it attaches that standby (replica.go).
	s.setRole(rolePrimary)
	kept = s.install(b, true)
	tables = s.tables.current()
	s.stopReplica()
	s.epoch = req.Epoch
	if req.StandbyAddr != "" {
		if err := s.startReplica(req.StandbyAddr); err != nil {
			return false, nil, err
		}
	}
	s.log.Info("shard initialised", "shard", req.Shard, "of", req.NumShards, "params", len(b.sh.Params()),
		"version", req.Version, "generation", req.Generation, "mode", b.opts.Mode, "run", req.RunId, "lr", b.opts.Rate(),
		"epoch", req.Epoch, "standby", req.StandbyAddr, "rows_kept", kept)
	return kept, tables, nil
}

// built is a shard an Init request describes, made before taking the lock.
type built struct {
	sh   *Shard
	ts   *TableSet // the embedding tables (nil: the run declares none)
	plan partition.Plan
	opts Options
	req  *pb.InitRequest
}

// build makes the shard req describes (Init's work that needs no lock);
// its errors are gRPC statuses: InvalidArgument, since they are all the
// request's.
func (s *Server) build(req *pb.InitRequest) (built, error) {
	b, err := s.buildShard(req)
	if err != nil {
		return built{}, status.Error(codes.InvalidArgument, err.Error())
	}
	return b, nil
}

// buildShard is build with the request's errors as they are.
func (s *Server) buildShard(req *pb.InitRequest) (built, error) {
	opts, err := OptionsFromProto(req.ShardOptions)
	if err != nil {
		return built{}, err
	}
	params, err := wire.Floats(req.Params)
	if err != nil {
		return built{}, err
	}
	params = append([]float32(nil), params...) // own it; the request buffer may be reused
	opt, err := optimizerOf(opts, req, len(params))
	if err != nil {
		return built{}, err
	}
	plan, err := planOf(req, len(params))
	if err != nil {
		return built{}, err
	}
	sc := ShardConfig{Mode: opts.Mode, Replicas: opts.Replicas, Staleness: opts.Staleness,
		Workers: opts.Workers, MaxVersion: req.MaxVersion, NormGuard: opts.NormGuard, Aggregate: opts.Aggregate,
		Dedupe: req.Epoch > 0}
	if sc.LR, err = lrSchedule(opts, req); err != nil {
		return built{}, err
	}
	sh, err := NewShard(sc, params, opt, req.Version)
	if err != nil {
		return built{}, err
	}
	if err := s.restorePositions(sh, req, opts.Workers); err != nil {
		return built{}, err
	}
	if req.LiveWorkers != nil {
		sh.SetLive(toInts(req.LiveWorkers))
	}
	return built{sh: sh, plan: plan, opts: opts, req: req}, nil
}

// optimizerOf makes the shard's optimizer for n parameters, with the
// state req restores (a checkpoint's or a snapshot's), if any.
func optimizerOf(opts Options, req *pb.InitRequest, n int) (optim.Optimizer, error) {
	opt, err := optim.New(optim.Config{Name: opts.Optimizer, LR: opts.Rate(), Momentum: opts.Momentum}, n)
	if err != nil {
		return nil, err
	}
	if len(req.OptimizerState) == 0 && req.OptimizerStep == 0 {
		return opt, nil
	}
	st, err := wire.Floats(req.OptimizerState)
	if err == nil {
		err = opt.SetState(st, req.OptimizerStep)
	}
	if err != nil {
		return nil, err
	}
	return opt, nil
}

// planOf is the model's partition req's spec and layout (its shard
// count and weights) describe, checked to give
// the shard n parameters (the zero plan when req has no spec).
func planOf(req *pb.InitRequest, n int) (partition.Plan, error) {
	if req.ModelSpec == nil {
		return partition.Plan{}, nil
	}
	plan, err := partition.LayoutOf(int(req.NumShards), req.ShardWeights).Plan(convert.Spec(req.ModelSpec))
	if err != nil {
		return partition.Plan{}, err
	}
	if req.Shard < 0 || int(req.Shard) >= len(plan.Shards) || plan.Shards[req.Shard].Size != n {
		return partition.Plan{}, fmt.Errorf("shard %d of %d: %d parameters do not match the model's partition", req.Shard, req.NumShards, n)
	}
	return plan, nil
}

// restorePositions gives sh the workers' data positions req carries,
// when they are of this run's workers (workers of them, or up to
// req.DataSlots of an elastic run's).
func (s *Server) restorePositions(sh *Shard, req *pb.InitRequest, workers int) error {
	pos := req.DataPositions
	if len(pos) > config.MaxWorkerSlots {
		// The shard would keep state for every one of them (grow).
		return fmt.Errorf("data positions of %d workers, at most %d", len(pos), config.MaxWorkerSlots)
	}
	if len(pos) == workers || req.DataSlots > 0 && len(pos) > 0 && len(pos) <= int(req.DataSlots) {
		// An elastic run's positions cover the workers that had joined
		// when the checkpoint was taken: the shard keeps state for every
		// one of them, and a worker beyond them starts at 0.
		sh.grow(len(pos))
		pos = append(slices.Clone(pos), make([]int64, sh.Slots()-len(pos))...)
		return sh.SetDataPositions(pos)
	}
	if len(pos) > 0 {
		// A checkpoint of a run with another number of workers: their data
		// shards were cut differently, so the positions mean nothing here.
		s.log.Warn("ignoring data positions for another number of workers; every worker starts its data shard afresh",
			"positions", len(pos), "workers", workers)
	}
	return nil
}

// install makes b the shard's state, replacing the one before; with
// inherit, the new shard keeps the old one's norm-guard window (a
// snapshot brings its own). It says whether the tables kept their rows
// (InitRequest.keep_rows). Call with mu held.
func (s *Server) install(b built, inherit bool) (kept bool) {
	sh, req, plan, opts, params := b.sh, b.req, b.plan, b.opts, b.sh.Params()
	if inherit && s.shard != nil && s.runID == req.RunId && s.index == int(req.Shard) {
		sh.InheritGuard(s.shard) // re-initialised by the chief: no warm-up to exploit
		sh.InheritQuarantine(s.shard)
	}
	s.shard, s.runID, s.index = sh, req.RunId, int(req.Shard)
	s.told = s.told[:0] // (a new state: no worker was told it is done)
	s.gen, s.numShards, s.plan, s.opts = req.Generation, int(req.NumShards), plan, opts
	s.dropRetained()
	s.window = Window{}
	s.retire(s.snap)
	s.snap = nil
	s.abortPending(func(*pendingSnap) bool { return true })
	s.m.GlobalStep.Set(float64(sh.Version()))
	s.m.ShardParameters.Set(float64(len(params)))
	s.m.RPCReceivedBytes.WithLabelValues("init").Add(float64(len(req.Params)))
	s.notify()
	s.refusals, s.guardLogged = refusalLog{}, false
	s.lastInit = initTemplate(req)
	s.replSeq = 0
	kept = s.tables.install(b.ts, req.RunId, req.Generation, opts.NaNPolicy == config.Skip, req.RowsLoading,
		req.KeepRows, req.KeepRowsVersion)
	s.tables.quarantine(sh)
	return kept
}

// lrSchedule is the run's learning rate as a function of the shard's
// version: --lr-schedule and --warmup-steps over the run's length as the
// chief gives it (steps per epoch, last version), the same on every shard,
// scaled by the chief's factor (Options.Rate). Constant without warmup is
// the zero schedule: the optimizer keeps the configured rate and never
// has it set.
func lrSchedule(o Options, req *pb.InitRequest) (optim.LRSchedule, error) {
	sched, err := optim.ParseSchedule(o.LRSchedule)
	if err != nil {
		return optim.LRSchedule{}, fmt.Errorf("lr_schedule %w", err)
	}
	if sched.Kind == optim.Constant && o.WarmupSteps == 0 {
		return optim.LRSchedule{}, nil
	}
	l, err := optim.NewLRSchedule(o.Rate(), sched, o.WarmupSteps, req.StepsPerEpoch, req.MaxVersion)
	if err != nil {
		return optim.LRSchedule{}, fmt.Errorf("%w (init request: steps_per_epoch %v, max_version %d)", err, req.StepsPerEpoch, req.MaxVersion)
	}
	return l, nil
}

func toInts(x []int32) []int {
	out := make([]int, len(x))
	for i, v := range x {
		out[i] = int(v)
	}
	return out
}

// checkRun verifies the request belongs to this run. Call with mu.
func (s *Server) checkRun(runID string) error {
	if s.shard == nil {
		return status.Error(codes.Unavailable, "shard not initialised yet (waiting for the chief)")
	}
	if runID != s.runID {
		// An empty run id too: every task of the run knows it from
		// registration, and a request without one is nobody's.
		s.m.RejectedRequests.WithLabelValues("run_id").Inc()
		return status.Errorf(codes.FailedPrecondition, "request for run %q, this shard serves run %q", runID, s.runID)
	}
	return nil
}

// Pull answers once the shard is ready for this worker.
func (s *Server) Pull(ctx context.Context, req *pb.PullRequest) (*pb.PullResponse, error) {
	resp, _, err := s.pull(ctx, req, false)
	return resp, err
}

// PullShared is Pull for the data plane: the response's parameters stay
// valid until release is called (exactly once, when they are written),
// after which the PS may reuse their buffer.
func (s *Server) PullShared(ctx context.Context, req *pb.PullRequest) (resp *pb.PullResponse, release func(), err error) {
	resp, p, err := s.pull(ctx, req, true)
	if err != nil {
		return nil, nil, err
	}
	return resp, func() { s.release(p) }, nil
}

// pull waits until the shard is ready for req's worker and answers with
// the current version's snapshot. With shared, the caller holds a
// reference to it (see pullSnap); otherwise the snapshot is never reused.
func (s *Server) pull(ctx context.Context, req *pb.PullRequest, shared bool) (*pb.PullResponse, *pullSnap, error) {
	start := s.now()
	defer s.observe("pull", start)
	s.mu.Lock()
	s.awaitInit(ctx)
	for {
		ready, err := s.pullReady(req)
		if err != nil {
			s.mu.Unlock()
			return nil, nil, err
		}
		if ready {
			break
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil, status.FromContextError(ctx.Err()).Err()
		}
		s.mu.Lock()
	}
	resp, p := s.answerPull(req, shared, start)
	spec := s.opts.Compress.Pull
	s.mu.Unlock()
	resp, err := s.mirrors.answer(req, resp, spec)
	if err != nil {
		if shared {
			s.release(p)
		}
		return nil, nil, err
	}
	s.m.RPCSentBytes.WithLabelValues("pull").Add(float64(len(resp.Params)))
	return resp, p, nil
}

// InitWait is how long a pull that finds the shard not initialised yet
// waits for the chief's Init before it is answered Unavailable.
//
// Why: a worker is up before the chief has initialised the shards (the
// chief starts training only once every task is), and a worker backs off
// between retries up to 1 s. Answered at once, its first pull slept past
// the Init by up to that second, inside the run's training time (in a
// 1 PS + 1 worker run, 0.73 s of 4.2 s; with hot standbys the first sync
// step came ~1.5 s after training began). Held, the pull is answered
// when the Init lands. A PS restarted after a crash waits for the
// chief's re-initialisation the same way. Bounded, so that a chief that
// never comes still turns into Unavailable and the worker's patience
// (--retry-timeout) counts as before.
const InitWait = time.Second

// awaitInit waits up to InitWait, with mu held (released meanwhile), for
// a shard that serves workers but is not initialised yet to be, or ctx
// to end.
func (s *Server) awaitInit(ctx context.Context) {
	if !s.awaitingInit() {
		return
	}
	t := time.NewTimer(InitWait)
	defer t.Stop()
	for s.awaitingInit() {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			s.mu.Lock()
			return
		case <-ctx.Done():
			s.mu.Lock()
			return
		}
		s.mu.Lock()
	}
}

// awaitingInit says the shard serves workers but the chief has not
// initialised it yet. Call with mu held.
func (s *Server) awaitingInit() bool { return s.shard == nil && s.serving() == nil }

// PullSharedNow is PullShared when the pull need not wait: ready is false
// (and nothing held) when it would. The data plane answers such a pull
// without watching its connection for a client gone meanwhile.
func (s *Server) PullSharedNow(req *pb.PullRequest) (resp *pb.PullResponse, release func(), ready bool, err error) {
	start := s.now()
	s.mu.Lock()
	if s.awaitingInit() {
		s.mu.Unlock()
		return nil, nil, false, nil // PullShared waits for the Init (InitWait)
	}
	if ready, err = s.pullReady(req); err != nil || !ready {
		s.mu.Unlock()
		return nil, nil, false, err
	}
	resp, p := s.answerPull(req, true, start)
	spec := s.opts.Compress.Pull
	s.mu.Unlock()
	if resp, err = s.mirrors.answer(req, resp, spec); err != nil {
		s.release(p)
		return nil, nil, false, err
	}
	s.observe("pull", start)
	s.m.RPCSentBytes.WithLabelValues("pull").Add(float64(len(resp.Params)))
	return resp, func() { s.release(p) }, true, nil
}

// pullReady says whether req's pull may be answered now. Call with mu
// held.
func (s *Server) pullReady(req *pb.PullRequest) (bool, error) {
	if err := s.serving(); err != nil {
		return false, err
	}
	if err := s.checkRun(req.RunId); err != nil {
		return false, err
	}
	if !s.replicated() {
		return false, nil // a version the standby does not hold yet
	}
	// A reader from another generation has parameters of a timeline
	// the chief rolled back: it gets the current state at once.
	return (req.Generation != 0 && req.Generation != s.gen) || s.shard.PullReady(int(req.Worker), req.MinVersion), nil
}

// answerPull answers a ready pull with the current snapshot, held for
// the caller when shared. Call with mu held.
func (s *Server) answerPull(req *pb.PullRequest, shared bool, start time.Time) (*pb.PullResponse, *pullSnap) {
	sh := s.shard
	p := s.current()
	params := p.b
	switch {
	case shared:
		p.readers++
	case p.lender != nil:
		params = slices.Clone(p.b) // (a lent buffer goes back; gRPC never says when it is done)
	default:
		p.escaped = true
	}
	resp := &pb.PullResponse{Version: sh.Version(), Params: params, Done: sh.Done() || sh.Retired(int(req.Worker)), Generation: s.gen}
	if resp.Done {
		s.toldDone(req.Worker)
	}
	if w := int(req.Worker); w >= 0 && w < sh.Slots() {
		resp.DataPosition = sh.DataPosition(w)
	}
	if req.Worker < 0 {
		s.evaluated(req.Retain, req.MinVersion == 0, p)
	}
	if req.Worker >= 0 {
		s.m.BarrierWait.Observe(s.now().Sub(start).Seconds())
	}
	return resp, p
}

// current returns the current version's pull snapshot, encoding it if
// no push wrote it and no pull or checkpoint has yet. Call with mu held.
func (s *Server) current() *pullSnap {
	if s.snap == nil || s.snap.version != s.shard.Version() {
		s.retire(s.snap)
		s.snap = s.newSnap(s.shard)
	}
	return s.snap
}

// maxSpareSnaps is how many retired snapshots a server keeps for reuse:
// a same-host data plane holds a version's snapshot until every
// connection answered from it asks again (dataplane, snapshots.go), so
// one may be released after the next version's snapshot was made, and a
// single spare would leave that version to a new buffer.
const maxSpareSnaps = 2

// newSnap encodes the shard's parameters into a spare snapshot, or a
// new one if there is none of the right size. Call with mu held.
func (s *Server) newSnap(sh *Shard) *pullSnap {
	src := wire.Bytes(sh.Params())
	p := s.spareSnap(len(src))
	copy(p.b, src)
	p.version = sh.Version()
	return p
}

// spareSnap is a snapshot of n bytes nobody holds, to write: a spare, or
// a new one if there is none of that size. Call with mu held.
func (s *Server) spareSnap(n int) *pullSnap {
	var p *pullSnap
	if k := len(s.spares); k > 0 {
		p, s.spares = s.spares[k-1], s.spares[:k-1]
	}
	if p == nil || len(p.b) != n {
		s.discard(p)
		p = s.allocSnap(n)
	}
	p.readers, p.escaped = 0, false
	return p
}

// nextSnap is a snapshot for the parameters a push is about to make,
// with its bytes viewed as the float32s the shard writes them as
// (Shard.Take): the update writes the next version's pull snapshot
// in its own pass, instead of a pull copying the parameters after it.
// nil where bytes cannot be viewed as float32s. Call with mu held.
func (s *Server) nextSnap() (*pullSnap, []float32) {
	p := s.spareSnap(4 * len(s.shard.Params()))
	out, ok := wire.View(p.b)
	if !ok {
		s.retire(p)
		return nil, nil
	}
	return p, out
}

// settleNext makes p (from nextSnap) the current snapshot if Take wrote
// the new version's parameters into it (PushResult.Wrote), or a spare
// again. Call with mu held.
func (s *Server) settleNext(p *pullSnap, wrote bool) {
	switch {
	case p == nil:
	case wrote:
		s.retire(s.snap)
		p.version = s.shard.Version()
		s.snap = p
	default:
		s.retire(p)
	}
}

// allocSnap is a new snapshot of n bytes: in a buffer the data plane
// lends, if it has one, else on the heap. Call with mu held.
func (s *Server) allocSnap(n int) *pullSnap {
	if s.snapBufs != nil {
		if b, ok := s.snapBufs.Lend(n); ok {
			return &pullSnap{b: b, lender: s.snapBufs}
		}
	}
	return &pullSnap{b: make([]byte, n)}
}

// discard drops a snapshot nobody holds: a lent buffer goes back to the
// data plane. Call with mu held.
func (s *Server) discard(p *pullSnap) {
	if p != nil && p.lender != nil {
		p.lender.Return(p.b)
	}
}

// UseSnapshotBuffers has the server keep the pull snapshots it makes from
// now on in buffers b lends (nil: on the heap).
func (s *Server) UseSnapshotBuffers(b SnapshotBuffers) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snapBufs = b
}

// ReturnSnapshotBuffers is for the end of the data plane that lends them:
// the server makes no more snapshots in lent buffers and gives back those
// nobody holds (the spares, the current snapshot, the retained state
// unless a checkpoint is writing it); a held one goes back when its last
// hold ends.
func (s *Server) ReturnSnapshotBuffers() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snapBufs = nil
	if r := s.retained; r != nil && r.writers == 0 && r.held.lender != nil {
		s.dropRetained()
	}
	if p := s.snap; p != nil && p.lender != nil && p.readers == 0 {
		s.snap = nil
		s.discard(p)
	}
	keep := s.spares[:0]
	for _, p := range s.spares {
		if p.lender != nil {
			s.discard(p)
		} else {
			keep = append(keep, p)
		}
	}
	clear(s.spares[len(keep):])
	s.spares = keep
}

// retire marks p as no longer the current snapshot; it becomes a spare
// once no pull is writing it. Call with mu held.
func (s *Server) retire(p *pullSnap) {
	if p == nil || p.readers != 0 || p.escaped || slices.Contains(s.spares, p) {
		return
	}
	if p.lender != nil && p.lender != s.snapBufs {
		s.discard(p) // (lent by a data plane the server no longer uses)
		return
	}
	if n := len(s.spares); n == maxSpareSnaps {
		s.discard(s.spares[0])
		copy(s.spares, s.spares[1:]) // the oldest goes
		s.spares = s.spares[:n-1]
	}
	s.spares = append(s.spares, p)
}

// release ends a hold on p (a data plane pull's or a checkpoint's).
func (s *Server) release(p *pullSnap) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unhold(p)
}

// Push applies or aggregates one gradient.
func (s *Server) Push(ctx context.Context, req *pb.PushRequest) (*pb.PushResponse, error) {
	return s.PushKept(ctx, req, nil)
}

// PushKept is Push for a caller that lends req.Grad's buffer (the data
// plane's): release, unless nil, is called exactly once when the server
// is done with the buffer, maybe after PushKept returns. A primary whose
// standby is attached queues the push for it as it is, and releases the
// buffer once the standby holds it, instead of copying it (a copy per
// push was the primary's largest allocation: 1.3 MB, hundreds of times
// a second). Without release the push is copied for the standby.
func (s *Server) PushKept(ctx context.Context, req *pb.PushRequest, release func()) (*pb.PushResponse, error) {
	return s.pushKept(ctx, req, release, nil)
}

// PushKeptSquares is PushKept of a gradient whose sum of squares as
// float32s the caller computed as it copied it (the data plane:
// dataplane.SquaresKeeper), bit for bit vec.SumSquares of req.Grad: a
// float32 gradient's norm then takes no pass of its own.
func (s *Server) PushKeptSquares(ctx context.Context, req *pb.PushRequest, release func(), sumSquares float64) (*pb.PushResponse, error) {
	return s.pushKept(ctx, req, release, &sumSquares)
}

// pushKept is PushKept, with the gradient's sum of squares if known.
func (s *Server) pushKept(ctx context.Context, req *pb.PushRequest, release func(), sq *float64) (*pb.PushResponse, error) {
	defer s.observe("push", s.now())
	s.m.RPCReceivedBytes.WithLabelValues("push").Add(float64(len(req.Grad)))
	s.mu.Lock()
	if err := s.serving(); err != nil {
		s.mu.Unlock()
		if release != nil {
			release()
		}
		return nil, err
	}
	resp, err, forward := s.applyPush(req, sq)
	if resp != nil && resp.Done {
		s.toldDone(req.Worker)
	}
	var w replicaWait
	if forward && s.rep != nil {
		// (The copy only for a standby: without one a push allocates
		// nothing. While the snapshot travels the push is answered at
		// once, so it may not hold the lent buffer.)
		if release != nil && s.rep.snapAcked {
			w = s.replicate(&pb.ReplicaOp{Op: &pb.ReplicaOp_Push{Push: req}}, release)
			release = nil // the link's now
		} else {
			w = s.replicate(&pb.ReplicaOp{Op: &pb.ReplicaOp_Push{Push: clonePush(req)}}, nil)
		}
	}
	s.mu.Unlock()
	if release != nil {
		release()
	}
	// Answered only once the standby holds it (replica.go).
	if err := s.awaitReplica(ctx, w); err != nil {
		return nil, err
	}
	return resp, err
}

// gradientMetrics is where a push's per-gradient series go: the
// exported ones, or mirror on a standby. Call with mu held.
func (s *Server) gradientMetrics() *metrics.PS {
	if s.role == roleStandby {
		return s.mirror
	}
	return s.m
}

// applyPush is Push's work on the shard, on a primary and on its standby
// alike; forward says the push reached the shard (it passed the run and
// payload checks), so the standby must apply it too. sq, unless nil, is
// req.Grad's sum of squares as float32s (PushKeptSquares). Call with mu
// held.
func (s *Server) applyPush(req *pb.PushRequest, sq *float64) (resp *pb.PushResponse, err error, forward bool) {
	if err := s.checkRun(req.RunId); err != nil {
		return nil, err, false
	}
	m := s.gradientMetrics()
	g, err := s.gradient(req.Grad)
	if err != nil {
		m.RejectedRequests.WithLabelValues("bad_length").Inc()
		return nil, status.Error(codes.InvalidArgument, err.Error()), false
	}
	if req.Generation != 0 && req.Generation != s.gen {
		// Computed from parameters the chief has since rolled back.
		m.StaleGradientsDropped.Inc()
		return s.pushAnswer(pb.PushResponse_STALE), nil, false
	}
	var next *pullSnap
	var out []float32
	if s.role != roleStandby { // (a standby serves no pulls: no snapshot to write)
		next, out = s.nextSnap()
	}
	in := Gradient{Worker: int(req.Worker), Version: req.Version, Values: g, After: req.DataPosition, Out: out}
	if sq != nil && s.readsFloats() {
		in.SumSquares, in.Squared = *sq, true
	}
	res, err := s.shard.Take(in)
	s.settleNext(next, res.Wrote)
	if err != nil {
		return s.pushRefused(m, req, err)
	}
	s.countPush(m, req, res)
	if res.Outcome == Quarantined {
		return &pb.PushResponse{Outcome: pb.PushResponse_STALE, Version: s.shard.Version(), Done: true}, nil, true
	}
	s.lastLoss = req.Loss
	switch {
	case res.Advanced:
		s.advanced()
	case s.opts.Mode == config.SSP:
		s.notify() // the slowest worker's clock may have moved
	}
	if res.Outcome == Refused {
		// Dropped, like a NaN under --nan-policy skip: the wire's
		// outcomes (and a data-plane client's check of them) predate the
		// guard, and the worker's next step is the same either way.
		return s.pushAnswer(pb.PushResponse_STALE), nil, true
	}
	return s.pushAnswer(pb.PushResponse_Outcome(res.Outcome)), nil, true
}

// pushAnswer is a push's response with outcome and the shard's version.
// Call with mu held.
func (s *Server) pushAnswer(outcome pb.PushResponse_Outcome) *pb.PushResponse {
	return &pb.PushResponse{Outcome: outcome, Version: s.shard.Version(), Done: s.shard.Done()}
}

// pushRefused is applyPush's answer to a gradient the shard refused with
// err: counted, and an InvalidArgument error, except a non-finite one
// under --nan-policy skip, which is dropped. A non-finite gradient
// reached the shard, so the standby must see it too (forward). Call with
// mu held.
func (s *Server) pushRefused(m *metrics.PS, req *pb.PushRequest, err error) (*pb.PushResponse, error, bool) {
	m.RejectedRequests.WithLabelValues(rejectReason(err)).Inc()
	nonFinite := errors.Is(err, ErrNonFinite)
	if nonFinite {
		m.RefusedGradients.WithLabelValues(strconv.Itoa(int(req.Worker)), "non_finite").Inc()
	}
	if nonFinite && s.opts.NaNPolicy == config.Skip {
		// --nan-policy skip: counted, never applied, training goes on.
		// In sync mode the worker still counts for the step, its
		// gradient left out of the mean (otherwise the step would wait
		// for it forever); either way its batch is used up (Drop).
		if s.shard.Drop(int(req.Worker), req.Version, req.DataPosition) {
			s.advanced()
		}
		return s.pushAnswer(pb.PushResponse_STALE), nil, true
	}
	return nil, status.Error(codes.InvalidArgument, err.Error()), nonFinite
}

// countPush records what the shard did with a gradient it took: its
// staleness and norm ratio, and a drop, refusal or quarantine. Call with
// mu held.
func (s *Server) countPush(m *metrics.PS, req *pb.PushRequest, res PushResult) {
	m.GradientStaleness.Observe(float64(res.Staleness))
	if res.Ratio > 0 {
		m.GradientNormRatio.Observe(res.Ratio)
	}
	switch res.Outcome {
	case Stale:
		m.StaleGradientsDropped.Inc()
	case Refused:
		s.refused(m, req, res)
	case Quarantined:
		m.RejectedRequests.WithLabelValues("quarantined").Inc()
	}
}

// refused records a gradient the norm guard refused: counted against its
// worker, and logged (rate-limited). Call with mu held.
func (s *Server) refused(m *metrics.PS, req *pb.PushRequest, res PushResult) {
	m.RefusedGradients.WithLabelValues(strconv.Itoa(int(req.Worker)), "norm").Inc()
	if ok, skipped := s.refusals.due(s.now()); ok {
		s.log.Warn("gradient refused by the norm guard: never applied", "worker", req.Worker, "version", req.Version,
			"norm", fmt.Sprintf("%.4g", res.Norm), "ratio", fmt.Sprintf("%.4g", res.Ratio), "limit", s.opts.NormGuard,
			"refused_by_worker", s.shard.Refused(), "not_logged_since_last", skipped)
	}
}

// readsFloats says a push's payload is the gradient's float32s as they
// are (gradient): neither compressed nor bfloat16. Call with mu held.
func (s *Server) readsFloats() bool {
	return s.opts.Compress.Push.Kind == compress.None && s.opts.WireDType != config.BF16
}

// gradient reads a push's payload as the run sends it: float32 (a view
// of b), or bfloat16 widened into a buffer the next push reuses. Call with
// mu held.
func (s *Server) gradient(b []byte) ([]float32, error) {
	if s.opts.Compress.Push.Kind != compress.None {
		return s.decompress(b)
	}
	if s.opts.WireDType != config.BF16 {
		return wire.Floats(b)
	}
	if n := len(s.shard.Params()); len(b) != 2*n {
		// Checked before widening: the buffer is kept, so it must never
		// grow past the shard for a bad push.
		return nil, fmt.Errorf("%w: got %d bytes of bfloat16, want %d", ErrBadLength, len(b), 2*n)
	}
	if cap(s.wide) < len(b)/2 {
		s.wide = make([]float32, len(b)/2)
	}
	g := s.wide[:len(b)/2]
	return g, wire.DecodeBF16(g, b)
}

func rejectReason(err error) string {
	switch {
	case errors.Is(err, ErrFutureVersion):
		return "future_version"
	case errors.Is(err, ErrBadLength):
		return "bad_length"
	case errors.Is(err, ErrBadWorker):
		return "bad_worker"
	case errors.Is(err, ErrNonFinite):
		return "non_finite"
	}
	return "other"
}

// SetMembership updates the live worker set.
func (s *Server) SetMembership(ctx context.Context, req *pb.MembershipRequest) (*pb.MembershipResponse, error) {
	defer s.observe("membership", s.now())
	s.mu.Lock()
	if err := s.serving(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	resp, err := s.applyMembership(req)
	var w replicaWait
	if err == nil {
		w = s.replicate(&pb.ReplicaOp{Op: &pb.ReplicaOp_Membership{Membership: req}}, nil)
	}
	s.mu.Unlock()
	if err := s.awaitReplica(ctx, w); err != nil {
		return nil, err
	}
	return resp, err
}

// applyMembership is SetMembership's work on the shard (primary and
// standby alike). Call with mu held.
func (s *Server) applyMembership(req *pb.MembershipRequest) (*pb.MembershipResponse, error) {
	if s.shard == nil {
		return nil, status.Error(codes.Unavailable, "shard not initialised yet")
	}
	advanced, err := s.shard.SetMembership(Membership{Live: toInts(req.LiveWorkers), Members: int(req.Members),
		Retired: toInts(req.Retired), Replicas: int(req.Replicas), MaxVersion: req.MaxVersion, HoldAt: req.HoldAt,
		Quarantined: toInts(req.Quarantined)})
	switch {
	case errors.Is(err, ErrBadMembership):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	s.tables.quarantine(s.shard)
	if advanced {
		s.advanced() // a step waiting for a dead worker completed
	} else {
		s.notify() // SSP bounds, joining and retired workers follow the membership
	}
	return &pb.MembershipResponse{Version: s.shard.Version()}, nil
}

// Status reports the shard's progress.
func (s *Server) Status(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shard == nil {
		return &pb.StatusResponse{DataAddr: s.dataAddr, Role: s.role, Epoch: s.epoch}, nil
	}
	st := s.shard.Stats()
	resp := &pb.StatusResponse{Version: s.visibleVersion(), Initialized: true, Done: s.shard.Done(),
		StaleDropped: st.StaleDropped, Applied: st.Applied, NumParams: int64(len(s.shard.Params())),
		RunId: s.runID, LastLoss: s.lastLoss, Generation: s.gen, MaxVersion: s.shard.MaxVersion(), DataAddr: s.dataAddr,
		RefusedGradients: s.shard.Refused(), NonFiniteGradients: s.shard.NonFinite(), DataGaps: gapTriples(s.shard.Gaps()),
		WindowDot: s.window.Dot, WindowSq: s.window.Sq, WindowUpdateSq: s.window.UpdateSq, WindowFrom: s.window.From, WindowTo: s.window.To}
	if o := s.shard.Outlier(); o != nil {
		w := int32(o.Worker)
		resp.FirstOutlierWorker = &w
	}
	s.replicaStatus(resp)
	return resp, nil
}

// gapTriples is gaps as StatusResponse.data_gaps carries them.
func gapTriples(gaps []Gap) []int64 {
	out := make([]int64, 0, 3*len(gaps))
	for _, g := range gaps {
		out = append(out, int64(g.Worker), g.From, g.To)
	}
	return out
}

// Stop ends training and optionally the process.
func (s *Server) Stop(ctx context.Context, req *pb.StopRequest) (*pb.StopResponse, error) {
	s.mu.Lock()
	var w replicaWait
	if s.role != roleStandby {
		s.applyStop()
		w = s.replicate(&pb.ReplicaOp{Op: &pb.ReplicaOp_Stop{Stop: &pb.StopRequest{}}}, nil)
	}
	s.mu.Unlock()
	// The standby follows. Awaited briefly, so the versions Status shows
	// after the stop are the shard's final ones (the chief marks the
	// final checkpoint by them); a dead standby does not hold up the end.
	sctx, cancel := context.WithTimeout(ctx, stopReplicaWait)
	s.awaitReplica(sctx, w)
	cancel()
	if req.Shutdown {
		s.log.Info("shutdown ordered by the chief")
		// Answer first: the process exits after the handler returns.
		go s.shutdown()
	}
	return &pb.StopResponse{}, nil
}

// toldDone records that worker (-1: the chief) was answered done. Call
// with mu held.
func (s *Server) toldDone(worker int32) {
	if w := int(worker); w >= 0 && w < s.shard.Slots() {
		for len(s.told) <= w {
			s.told = append(s.told, false)
		}
		s.told[w] = true
	}
}

// Drained says no worker still needs this process to answer it: it is
// no primary whose training is over, its shard is held (a PS count
// change's: its workers moved to the new layout, and a held shard
// answers no worker), or every live worker that is not retired has been
// answered done. A process told to exit waits for it, briefly
// (task.PS.Wait), so that a worker whose last push was under way at the
// stop is answered done instead of finding nobody, which it would take
// for a shard that is down and retry.
func (s *Server) Drained() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.role != rolePrimary || s.shard == nil || !s.shard.Done() || s.shard.held() {
		return true
	}
	for w := range s.shard.Slots() {
		if s.shard.Live(w) && !s.shard.Retired(w) && (w >= len(s.told) || !s.told[w]) {
			return false
		}
	}
	return true
}

// applyStop is Stop's work on the shard (primary and standby alike). Call
// with mu held.
func (s *Server) applyStop() {
	if s.shard != nil {
		if !s.guardLogged {
			s.guardLogged = true
			s.logGuard()
		}
		s.shard.Stop()
		// Versions beyond this one will never come.
		v := s.shard.Version()
		s.abortPending(func(p *pendingSnap) bool { return p.at != v })
		s.firePending()
	}
	s.tables.stop()
	s.notify()
}

// logGuard logs what the norm guard saw since Init: the largest norm
// ratio and whose it was, and the refusals. Call with mu held.
func (s *Server) logGuard() {
	st := s.shard.Stats()
	s.log.Info("gradient norms at the stop", "gradients", st.Applied+st.Refused, "refused", st.Refused,
		"max_ratio", fmt.Sprintf("%.3g", st.MaxRatio), "max_ratio_worker", st.MaxRatioWorker, "max_ratio_version", st.MaxRatioVersion,
		"limit", s.opts.NormGuard, "refused_by_worker", s.shard.Refused())
}

// Snapshot copies the shard's state (for checkpoints and tests).
func (s *Server) Snapshot() (version int64, params, optState []float32, optSteps int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shard == nil {
		return 0, nil, nil, 0, fmt.Errorf("ps: shard not initialised")
	}
	sn := s.takeSnapshot()
	params = slices.Clone(sn.params) // (before unhold: the last hold on a lent buffer may give it back)
	s.unhold(sn.held)
	return sn.version, params, sn.opt, sn.optSteps, nil
}

// takeSnapshot copies the shard's state: the parameters are the current
// pull snapshot, held until unhold, so a checkpoint copies them at
// most once per version and no more than a pull would. Call with mu held.
func (s *Server) takeSnapshot() snapshot {
	t0 := s.now()
	p := s.current()
	p.readers++
	var sn snapshot
	s.fillSnapshot(&sn, p)
	sn.pause = s.now().Sub(t0)
	return sn
}

// fillSnapshot fills sn with the shard's state, its parameters being p
// (the current pull snapshot, which the caller holds); the optimizer state
// and the positions are copied into sn's buffers. Call with mu held.
func (s *Server) fillSnapshot(sn *snapshot, p *pullSnap) {
	params, err := wire.Floats(p.b)
	if err != nil {
		panic(err) // p.b was encoded from whole float32s
	}
	st, steps := s.shard.Optimizer().State()
	sn.version, sn.params, sn.held = s.shard.Version(), params, p
	sn.opt, sn.optSteps = append(sn.opt[:0], st...), steps
	sn.positions = sn.positions[:0]
	for w := range s.shard.Slots() {
		sn.positions = append(sn.positions, s.shard.DataPosition(w))
	}
	sn.plan, sn.index, sn.numShards, sn.optName, sn.runID = s.plan, s.index, s.numShards, s.opts.Optimizer, s.runID
	sn.tables = s.tables.snapshot(sn.tables, sn.version)
}

// dropRetainedOp is the replicated retain that drops the retained state.
const dropRetainedOp = -1

// evaluated is a chief's evaluation pull of p's version: it closes the
// attribution window (unless closeWindow is false: the chief pulls the
// shard again for the same evaluation) and, with retain, keeps the
// version's state (a target stop hands it back); without, it drops what an evaluation kept
// before, which holds the tables' frozen slots (every block written
// since costs a copy). The standby keeps or drops the same: a pull is
// answered only once it holds every update, so the op reaches it right
// after the updates that made this version. Not awaited: a primary lost
// before the op arrives leaves no retained state, and the target stop's
// checkpoint falls back to the live state. Call with mu held.
func (s *Server) evaluated(retain, closeWindow bool, p *pullSnap) {
	if closeWindow {
		s.window = s.shard.CloseWindow()
	}
	switch {
	case retain:
		s.retain(p)
		s.replicate(&pb.ReplicaOp{Op: &pb.ReplicaOp_Retain{Retain: s.shard.Version()}}, nil)
	case s.retained != nil:
		s.dropRetained()
		s.replicate(&pb.ReplicaOp{Op: &pb.ReplicaOp_Retain{Retain: dropRetainedOp}}, nil)
	}
}

// retain keeps the shard's current state, whose pull snapshot p is, for a
// later Checkpoint with retained set, replacing (and releasing) the state
// retained before. Call with mu held.
func (s *Server) retain(p *pullSnap) {
	r := s.retained
	if r != nil {
		s.unhold(r.held)
		if r.writers > 0 {
			r = nil // a checkpoint is writing its buffers: leave them to it
		}
	}
	if r == nil {
		r = &retainedSnap{}
	}
	p.readers++
	s.fillSnapshot(&r.snapshot, p)
	s.retained = r
}

// dropRetained forgets the retained state. Call with mu held.
func (s *Server) dropRetained() {
	if r := s.retained; r != nil {
		s.retained = nil
		s.unhold(r.held)
	}
}

// holdRetained marks the retained state as being written by a checkpoint
// (release it with releaseRetained) and returns it with its parameters
// held for the caller. at, if not 0, must be its version. Call with mu
// held.
func (s *Server) holdRetained(at int64) (*retainedSnap, error) {
	r := s.retained
	switch {
	case r == nil:
		return nil, status.Error(codes.FailedPrecondition,
			"no retained state to checkpoint: no evaluation pull with retain set since this shard was (re)initialised (a restarted PS retains nothing)")
	case at != 0 && at != r.version:
		return nil, status.Errorf(codes.FailedPrecondition, "the retained state is of version %d, the checkpoint asks for version %d", r.version, at)
	}
	r.writers++
	r.held.readers++
	return r, nil
}

// releaseRetained ends a checkpoint's use of r's buffers. The last
// writer of a retained state in a lent buffer, once the buffers were
// asked back (ReturnSnapshotBuffers skipped it while it was written),
// drops it, so that its buffer goes back.
func (s *Server) releaseRetained(r *retainedSnap) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.writers--
	if r.writers == 0 && s.snapBufs == nil && s.retained == r && r.held.lender != nil {
		s.dropRetained()
	}
}

// unhold ends one hold on p; once nobody holds it and it is no longer
// current, it becomes a spare. Call with mu held.
func (s *Server) unhold(p *pullSnap) {
	p.readers--
	if p.readers < 0 {
		// Reusing a snapshot someone still writes would send or save
		// another version's parameters: stop rather than do that.
		panic("ps: a pull snapshot was released more often than it was held")
	}
	switch {
	case p != s.snap:
		s.retire(p)
	case p.readers == 0 && p.lender != nil && p.lender != s.snapBufs:
		s.snap = nil // (lent by a data plane the server no longer uses)
		s.discard(p)
	}
}

// advanced publishes a new version: the gauge, blocked pulls, and the
// checkpoints waiting for it. Call with mu held.
func (s *Server) advanced() {
	if err := s.tables.advance(s.shard); err != nil {
		s.log.Error("embedding tables: applying the step's rows failed", "version", s.shard.Version(), "err", err)
	}
	s.m.GlobalStep.Set(float64(s.shard.Version()))
	s.notify()
	s.firePending()
}

// firePending hands a snapshot to the checkpoint requests waiting for the
// current version, and gives up on those whose version has passed (it
// cannot happen in sync mode, where versions move one at a time). Call
// with mu held.
func (s *Server) firePending() {
	if len(s.pending) == 0 {
		return
	}
	v := s.shard.Version()
	var sn *snapshot
	keep := s.pending[:0]
	for _, p := range s.pending {
		switch {
		case p.at == v:
			if sn == nil {
				x := s.takeSnapshot()
				sn = &x
			} else {
				sn.held.readers++ // every receiver releases its own hold
			}
			p.ch <- *sn
		case p.at < v:
			close(p.ch)
		default:
			keep = append(keep, p)
		}
	}
	clear(s.pending[len(keep):])
	s.pending = keep
}

// abortPending closes the channels of the pending requests drop selects.
// Call with mu held.
func (s *Server) abortPending(drop func(*pendingSnap) bool) {
	keep := s.pending[:0]
	for _, p := range s.pending {
		if drop(p) {
			close(p.ch)
		} else {
			keep = append(keep, p)
		}
	}
	clear(s.pending[len(keep):])
	s.pending = keep
}

// Checkpoint snapshots the shard when it reaches req.AtVersion (now if 0)
// and writes the snapshot to the checkpoint store. Only the copy holds
// the shard's lock; training goes on while the file is written.
func (s *Server) Checkpoint(ctx context.Context, req *pb.CheckpointRequest) (*pb.CheckpointResponse, error) {
	defer s.observe("checkpoint", s.now())
	if s.store == nil {
		return nil, status.Error(codes.FailedPrecondition, "this parameter server has no --checkpoint-dir")
	}
	sn, r, err := s.checkpointSnapshot(ctx, req)
	if err != nil {
		return nil, err
	}
	if r != nil {
		defer s.releaseRetained(r)
	}
	defer s.release(sn.held)
	return s.writeCheckpoint(req, sn)
}

// checkpointSnapshot is the snapshot req asks for, held: the retained
// state (r, also held), or the shard's own at req.AtVersion, taken now or
// when the shard reaches that version.
func (s *Server) checkpointSnapshot(ctx context.Context, req *pb.CheckpointRequest) (snapshot, *retainedSnap, error) {
	s.mu.Lock()
	if err := s.checkpointable(req.RunId); err != nil {
		s.mu.Unlock()
		return snapshot{}, nil, err
	}
	if req.Retained {
		r, err := s.holdRetained(req.AtVersion)
		s.mu.Unlock()
		if err != nil {
			return snapshot{}, nil, err
		}
		return r.snapshot, r, nil
	}
	sn, p, err := s.snapshotAt(req.AtVersion)
	s.mu.Unlock()
	if p == nil || err != nil {
		return sn, nil, err
	}
	sn, err = s.awaitSnapshot(ctx, p)
	return sn, nil, err
}

// checkpointable refuses a checkpoint of another run, or of a shard
// initialised without a model spec. Call with mu held.
func (s *Server) checkpointable(runID string) error {
	if err := s.checkRun(runID); err != nil {
		return err
	}
	if len(s.plan.Shards) == 0 {
		return status.Error(codes.FailedPrecondition, "the shard was initialised without a model spec; cannot name checkpoint tensors")
	}
	return nil
}

// snapshotAt takes the shard's snapshot if it is at version at (or at
// is 0); if it has yet to reach at, it returns the pending request that
// will receive it instead. A version the shard is past, or will never
// reach since training ended, is refused. Call with mu held.
func (s *Server) snapshotAt(at int64) (snapshot, *pendingSnap, error) {
	v := s.shard.Version()
	switch {
	case at == 0 || at == v:
		return s.takeSnapshot(), nil, nil
	case at < v:
		return snapshot{}, nil, status.Errorf(codes.FailedPrecondition, "shard is at version %d, past the checkpoint's version %d", v, at)
	case s.shard.Done():
		return snapshot{}, nil, status.Errorf(codes.FailedPrecondition, "training ended at version %d, before the checkpoint's version %d", v, at)
	}
	p := &pendingSnap{at: at, ch: make(chan snapshot, 1)}
	s.pending = append(s.pending, p)
	return snapshot{}, p, nil
}

// awaitSnapshot waits for p's snapshot, held, unless ctx ends first or
// the shard never reaches p's version.
func (s *Server) awaitSnapshot(ctx context.Context, p *pendingSnap) (snapshot, error) {
	select {
	case sn, ok := <-p.ch:
		if !ok {
			return snapshot{}, status.Errorf(codes.Aborted, "the shard never reached version %d (stopped or re-initialised)", p.at)
		}
		return sn, nil
	case <-ctx.Done():
		s.mu.Lock()
		s.abortPending(func(q *pendingSnap) bool { return q == p })
		s.mu.Unlock()
		// The snapshot may have been taken meanwhile. (This never
		// blocks: a request leaves pending only by being sent its
		// snapshot or having its channel closed.)
		if sn, ok := <-p.ch; ok {
			s.release(sn.held)
		}
		return snapshot{}, status.FromContextError(ctx.Err()).Err()
	}
}

// writeCheckpoint writes sn to the checkpoint store as req's step.
func (s *Server) writeCheckpoint(req *pb.CheckpointRequest, sn snapshot) (*pb.CheckpointResponse, error) {
	// Name the snapshot with the state it was taken from (an Init since
	// then does not relabel it).
	tensors, err := sn.tensors()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	meta := map[string]string{
		shardckpt.MetaOptimizer:      sn.optName,
		shardckpt.MetaOptimizerSteps: strconv.FormatInt(sn.optSteps, 10),
		shardckpt.MetaVersion:        strconv.FormatInt(sn.version, 10),
		shardckpt.MetaRunID:          sn.runID,
	}
	t0 := s.now()
	info, err := s.store.WriteShard(req.Step, sn.index, sn.numShards, tensors, meta)
	if err != nil {
		s.log.Error("checkpoint write failed", "step", req.Step, "err", err)
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.log.Info("checkpoint shard written", "step", req.Step, "version", sn.version, "retained", req.Retained, "bytes", info.Bytes,
		"pause", sn.pause, "write", s.now().Sub(t0).Round(time.Microsecond))
	return &pb.CheckpointResponse{File: info.File, Sha256: info.SHA256, Bytes: info.Bytes, Tensors: info.Tensors,
		Version: sn.version, PauseSeconds: sn.pause.Seconds(), DataPositions: slices.Clone(sn.positions)}, nil
}
