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
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/retry"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/wire"
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
// reads them there (nn.Net.ReadFrom, inplace.go): no copy into its
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
	// at the shard while this step's push is under way (Run,
	// pushAndPull), and so that the net can read a pull's answer in
	// place until the next pull (inplace.go). nil: pulls use Client,
	// after the push is answered.
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
	Net     *nn.Net // built for Run.Batch with gradients
	Shards  []Shard
	Batches BatchSource
	Log     *slog.Logger
	Metrics *metrics.Worker // nil: not recorded
	// RetryTimeout bounds how long an unavailable shard is retried.
	RetryTimeout time.Duration
	// BeforePush, if set, is called before each push with the step about to
	// be pushed (tests use it to observe and to slow a worker down). A
	// worker with it pushes no shard early (early.go).
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
}

// Worker runs the loop.
type Worker struct {
	cfg      Config
	flat     [][]float32 // per-shard gradient gather buffers (float32 pushes), else nil
	half     [][]byte    // per-shard bfloat16 push buffers (--wire-dtype bf16), else nil
	labels   []uint8     // the batch's labels
	next     int64       // the data position Batches is at (-1: not yet known)
	step     int64
	lastLoss float32
	mu       sync.Mutex // guards step, lastLoss for Progress
	faults   faults
	tags     []ps.PullView // a step's pull views, kept for its pushes while the next pulls overwrite views
	early    *early        // early pushes (early.go); nil: none
	ahead    *ahead        // starting steps ahead (ahead.go); nil: not
	// In-place reads (inplace.go): by shard, whether the net reads its
	// parameters where its pulls leave them, the answer it reads now
	// (nil: its weights), and whether a pull sent since may have
	// unmapped that answer. Each shard's entries are its pull's.
	inPlace     []bool
	placed      [][]float32
	placedStale []bool
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
	if cfg.CatchUpAfter <= 0 {
		cfg.CatchUpAfter = ps.CatchUpAfter
	}
	w := &Worker{cfg: cfg, labels: make([]uint8, cfg.Net.Batch()), tags: make([]ps.PullView, len(cfg.Shards))}
	for _, f := range cfg.Faults {
		if f.Worker == cfg.Index {
			w.faults.list = append(w.faults.list, f)
			w.faults.fired = append(w.faults.fired, false)
		}
	}
	for _, s := range cfg.Plan.Shards {
		if cfg.Run.WireDType == config.BF16 {
			w.half = append(w.half, make([]byte, 2*s.Size))
		} else {
			w.flat = append(w.flat, make([]float32, s.Size))
		}
	}
	w.setupEarly()
	w.setupAhead()
	w.setupInPlace()
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
//
// Each step it pulls every shard (pullAll, which aligns the answers by
// ps.Align), computes the gradient on the batch at its data position and
// pushes each shard its slice. In sync mode ps.Align may instead ask for
// a catch-up: a gradient pushed only to shards that stay behind the
// others (see catchUp), after which the step's pulls start again.
func (w *Worker) Run(ctx context.Context) error {
	defer w.unplace()
	c := w.cfg
	n := len(c.Shards)
	var minVersion int64            // sync: the version every shard must reach
	views := make([]ps.PullView, n) // what each shard's latest pull answered
	positions := make([]int64, n)   // this worker's data position on each shard
	all := make([]int, n)           // every shard, for a step's pushes
	for s := range all {
		all[s] = s
	}
	w.next = -1 // not yet known
	overlap := c.Run.Mode == config.Sync && w.pullersApart()
	var next *stepPulls // the next step's pulls, made alongside this step's pushes
	for {
		t0 := time.Now()
		var a ps.Alignment
		var err error
		if next != nil {
			a, err, t0 = next.a, next.err, next.since
			next = nil
		} else {
			a, err = w.pullAll(ctx, minVersion, views, positions)
		}
		if err != nil {
			return err
		}
		switch a.Action {
		case ps.AlignDone:
			c.Log.Info("training done", "worker", c.Index, "steps", w.step, "early_pushes", w.EarlyPushes(), "steps_started_ahead", w.AheadSteps())
			return nil
		case ps.AlignCatchUp:
			if err := w.catchUp(ctx, a, views, positions); err != nil {
				return err
			}
			minVersion = a.Version // every shard, the lagging ones once caught up
			continue
		}
		if c.AfterPull != nil {
			c.AfterPull(w.step)
		}
		t1 := time.Now()
		c.Metrics.ObservePhase(metrics.PhasePull, t1.Sub(t0))

		w.arm(ctx, views)
		loss, grads, err := w.compute(positions)
		w.disarm()
		if err != nil {
			_, wait := w.collectEarly(nil) // none outlives Run
			return errors.Join(err, wait())
		}
		t2 := time.Now()
		c.Metrics.ObservePhase(metrics.PhaseCompute, t2.Sub(t1))

		if c.BeforePush != nil {
			c.BeforePush(w.step)
		}
		w.poison(views, grads)
		if c.Run.Mode == config.Sync {
			minVersion = a.Version + 1 // the step's version on every shard
		}
		if overlap {
			if next, err = w.pushAndPull(ctx, all, views, positions, loss, grads, minVersion); err != nil {
				return err
			}
			c.Metrics.ObservePhase(metrics.PhasePush, next.since.Sub(t2))
		} else {
			if err := w.pushAll(ctx, all, views, loss, grads); err != nil {
				return err
			}
			c.Metrics.ObservePhase(metrics.PhasePush, time.Since(t2))
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

// stepPulls is what the next step's pulls answered (pullAll's results),
// and since, when the step's pushes were answered: the next step's pull
// phase counts from there.
type stepPulls struct {
	a     ps.Alignment
	err   error
	since time.Time
}

// pushAndPull pushes the step's gradients and, at the same time, pulls
// the next step's parameters at minVersion (sync: the version the step's
// pushes complete), each shard's pull on its Puller.
//
// Why: sent after the push is answered, the pull of the step's last
// pusher crossed to the PS and back once more after the step completed,
// and that worker started its next step that much after the others,
// which then waited for it at the next barrier. Sent together, the pull
// waits at the shard and is answered when the step completes.
//
// The pulls overwrite views and positions; the pushes are tagged with
// the versions this step pulled (a copy, w.tags). Only an answer that
// is what a pull sent after the push would give is kept: a step at
// minVersion or later. Anything else (a shard restarted meanwhile, a
// rollback, a catch-up, done, an error) is pulled again after the
// pushes, from the views as they were, as the sequential loop does.
func (w *Worker) pushAndPull(ctx context.Context, all []int, views []ps.PullView, positions []int64, loss float32, grads [][]float32, minVersion int64) (*stepPulls, error) {
	copy(w.tags, views)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := &stepPulls{}
	pulled := make(chan struct{})
	go func() {
		defer close(pulled)
		res.a, res.err = w.pullAll(pctx, minVersion, views, positions)
	}()
	err := w.pushAll(ctx, all, w.tags, loss, grads)
	res.since = time.Now()
	if err != nil {
		cancel() // the step may never complete without this push
		<-pulled
		copy(views, w.tags)
		return nil, err
	}
	<-pulled
	if res.err != nil || res.a.Action != ps.AlignStep || res.a.Version < minVersion {
		copy(views, w.tags)
		res.a, res.err = w.pullAll(ctx, minVersion, views, positions)
	}
	return res, nil
}

// compute runs the forward and backward pass on the batch at the data
// position, one past the furthest batch of this worker's that some shard
// holds (positions: what each shard's pull said), and returns the loss
// and the gradients. w.next is then the batch's position + 1.
func (w *Worker) compute(positions []int64) (float32, [][]float32, error) {
	c := w.cfg
	pos := slices.Max(positions)
	if w.takeAhead(pos) {
		w.next = pos + 1 // the batch is in the input already
	} else {
		if pos != w.next {
			switch {
			case w.next < 0:
				c.Log.Info("data position", "worker", c.Index, "batch", pos)
			case pos == w.next-1:
				// No shard counted the last gradient (stale everywhere,
				// e.g. a backup worker's that lost the race, or a
				// duplicate catch-up): no sample of it is in the model
				// yet.
				c.Log.Debug("gradient not counted; using its batch again", "worker", c.Index, "batch", pos)
			default:
				c.Log.Warn("data position moved by the parameter servers (a rollback to a checkpoint?)", "worker", c.Index, "from", w.next, "to", pos)
			}
			c.Batches.SeekBatch(pos)
			w.next = pos
		}
		c.Batches.Next(c.Net.Input(), w.labels)
		w.next++
	}
	c.Net.SetLabels(w.labels)
	loss, err := c.Net.Step()
	if err != nil {
		return 0, nil, err
	}
	grads, err := c.Net.Grads()
	if err != nil {
		return 0, nil, err
	}
	return loss, grads, nil
}

// poison applies the worker's gradient faults (Config.Faults) to a
// gradient computed from the parameters views describe.
func (w *Worker) poison(views []ps.PullView, grads [][]float32) {
	if len(w.faults.list) == 0 {
		return
	}
	var version int64
	for _, v := range views {
		version = max(version, v.Version)
	}
	k := w.faults.scale(version)
	if k == 1 {
		return
	}
	if !w.faults.logged {
		w.faults.logged = true // (once: an every-step fault would flood the log)
		w.cfg.Log.Warn("fault injection (--fault-gradient): scaling this worker's gradient", "worker", w.cfg.Index, "version", version, "scale", k)
	}
	for _, g := range grads {
		for i := range g {
			g[i] *= k
		}
	}
}

// catchUp pushes the shards in a.CatchUp a gradient computed on the
// parameters the worker has, each tagged with the version and generation
// that shard answered with (ps.Align, AlignCatchUp; the others are at
// a.Version). The shard counts it
// if this worker has not contributed to its step yet (a new incarnation
// of a worker that died between its pushes, or a backup worker), which
// completes a step that would otherwise wait for good; from a worker that
// has, it is a duplicate and changes nothing. It takes a batch like a
// step: counted, the batch is used up (the shard moves the data
// position); a duplicate's batch is taken again by the next step.
func (w *Worker) catchUp(ctx context.Context, a ps.Alignment, views []ps.PullView, positions []int64) error {
	c := w.cfg
	c.Log.Warn("parameter server stuck behind the others: pushing it a catch-up gradient (a worker died between its pushes?)",
		"worker", c.Index, "ps", a.CatchUp, "version", views[a.CatchUp[0]].Version, "others_at", a.Version)
	loss, grads, err := w.compute(positions)
	if err != nil {
		return err
	}
	return w.pushAll(ctx, a.CatchUp, views, loss, grads)
}

// pushAll pushes each shard in shards its slice of grads (but those the
// step pushed early, whose answers it waits for), in parallel,
// tagged with the version and generation its pull answered with and the
// data position after the batch (w.next).
func (w *Worker) pushAll(ctx context.Context, shards []int, views []ps.PullView, loss float32, grads [][]float32) error {
	rest, wait := w.collectEarly(shards)
	err := w.pushShards(ctx, rest, views, loss, grads)
	return errors.Join(err, wait())
}

// pushShards is pushAll of shards none of which went early.
func (w *Worker) pushShards(ctx context.Context, shards []int, views []ps.PullView, loss float32, grads [][]float32) error {
	c := w.cfg
	errs := make([]error, len(shards))
	fanOut(len(shards), func(i int) {
		s := shards[i]
		req := &pb.PushRequest{Worker: int32(c.Index), Version: views[s].Version, RunId: c.RunID, Loss: loss, Generation: views[s].Generation,
			DataPosition: w.next} // the batch's position + 1
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
		errs[i] = w.retry(ctx, s, "push", push)
		bytes := 4 * c.Plan.Shards[s].Size
		if w.half != nil {
			bytes = len(w.half[s])
		}
		c.Metrics.RPCSentBytes.WithLabelValues("push").Add(float64(bytes))
	})
	return errors.Join(errs...)
}

// fanOut runs f(0) ... f(n-1) in parallel and returns when all have:
// the last on the calling goroutine, which would otherwise only wait (a
// goroutine fewer to start and wake per round, on cores the whole
// cluster shares).
func fanOut(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := range n - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	if n > 0 {
		f(n - 1)
	}
	wg.Wait()
}

// pullAll pulls every shard at minVersion in parallel, straight into the
// net's weights, recording each answer in views and the data position it
// gave in positions, then applies ps.Align to the answers and pulls again
// the shards it names until it decides: a step on these parameters, a
// catch-up, or done. The rule is ps.Align's; this is the RPC loop around
// it.
//
// A shard that says done ends the other pulls. A bounded pull (a shard
// behind the others, pulled at their version) that does not answer within
// CatchUpAfter marks the shard Stalled, which Align turns into a
// catch-up.
func (w *Worker) pullAll(ctx context.Context, minVersion int64, views []ps.PullView, positions []int64) (ps.Alignment, error) {
	pulls := make([]ps.Pull, len(views))
	for s := range pulls {
		pulls[s] = ps.Pull{Shard: s, MinVersion: minVersion}
	}
	w.aheadOpen()
	for first := true; ; first = false {
		if !first {
			w.keepPlaced(pulls)
		}
		err := w.pullRound(ctx, pulls, views, positions)
		a := ps.Align(w.cfg.Run.Mode, views)
		if first {
			w.aheadClose(a)
		}
		switch {
		case a.Action == ps.AlignDone:
			return a, nil // the other pulls were cancelled
		case err != nil:
			return ps.Alignment{}, err
		case a.Action != ps.AlignPull:
			return a, nil
		}
		pulls = a.Pulls
	}
}

// pullRound runs pulls in parallel (see pullAll); a pull that answers
// done cancels the others.
func (w *Worker) pullRound(ctx context.Context, pulls []ps.Pull, views []ps.PullView, positions []int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(pulls))
	fanOut(len(pulls), func(i int) {
		p := pulls[i]
		errs[i] = w.pullOne(ctx, cancel, p, &views[p.Shard], &positions[p.Shard])
	})
	return errors.Join(errs...)
}

// pullOne is one pull of a round: it reads the parameters into the net
// and records the answer in view and pos, or marks view Stalled if the
// pull was bounded and its bound passed first.
func (w *Worker) pullOne(ctx context.Context, cancel context.CancelFunc, p ps.Pull, view *ps.PullView, pos *int64) error {
	c := w.cfg
	s := p.Shard
	pctx := ctx
	if p.Bounded {
		var stop context.CancelFunc
		pctx, stop = context.WithTimeout(ctx, c.CatchUpAfter)
		defer stop()
	}
	resp, err := w.pull(pctx, s, p.MinVersion, view.Generation)
	if err != nil {
		// The data plane's deadline can fire a moment before the
		// context's: either says the bound passed.
		if p.Bounded && ctx.Err() == nil && (pctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded) {
			view.Stalled = true
			return nil
		}
		return err
	}
	var flat []float32 // nil: read straight into the net's parameters
	if resp.Params != nil {
		flat, err = wire.Floats(resp.Params)
		if err == nil && len(flat) != c.Plan.Shards[s].Size {
			err = fmt.Errorf("shard %d (%s) sent %d parameters, plan says %d", s, c.Shards[s].Addr, len(flat), c.Plan.Shards[s].Size)
		}
		if err != nil {
			return err
		}
	}
	w.readShard(s, flat)
	if resp.Generation != view.Generation && view.Generation != 0 {
		c.Log.Warn("parameter server state replaced by the chief", "ps", s, "generation", resp.Generation, "version", resp.Version)
	}
	*view = ps.PullView{Version: resp.Version, Generation: resp.Generation, Done: resp.Done}
	*pos = resp.DataPosition
	c.Metrics.RPCReceivedBytes.WithLabelValues("pull").Add(float64(4 * c.Plan.Shards[s].Size))
	if resp.Done {
		cancel()
		return nil
	}
	w.aheadAnswered(s)
	return nil
}

func (w *Worker) pull(ctx context.Context, s int, minVersion, gen int64) (*pb.PullResponse, error) {
	var resp *pb.PullResponse
	w.pullStarts(s)
	err := w.retry(ctx, s, "pull", func() error {
		var err error
		req := &pb.PullRequest{Worker: int32(w.cfg.Index), MinVersion: minVersion, RunId: w.cfg.RunID, Generation: gen}
		cl := w.cfg.Shards[s].puller()
		vp, viewing := cl.(ViewingDataPlane)
		sp, segmented := cl.(SegmentedDataPlane)
		switch {
		case viewing && w.inPlace != nil && w.inPlace[s]:
			resp, err = vp.PullView(ctx, req, w.cfg.Plan.Segments(s, w.cfg.Net.Params()))
		case segmented:
			resp, err = sp.PullInto(ctx, req, w.cfg.Plan.Segments(s, w.cfg.Net.Params()))
		default:
			resp, err = cl.Pull(ctx, req)
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

// Located is a DataPlane that can say which process its calls go to
// now (a shard with a hot standby switches between two: NewFailover).
type Located interface {
	Where() string
}

// where names the process shard s's calls of op ("pull" or another) go
// to now: "ps/0 at ADDR", or what its client says (pulls have their own,
// Shard.Puller, which may have switched processes at another moment).
func (w *Worker) where(s int, op string) string {
	cl := w.cfg.Shards[s].Client
	if op == "pull" {
		cl = w.cfg.Shards[s].puller()
	}
	if l, ok := cl.(Located); ok {
		return l.Where()
	}
	return fmt.Sprintf("ps/%d at %s", s, w.cfg.Shards[s].Addr)
}

// retry calls f until it succeeds, fails with a non-retryable error, or
// the shard has been unavailable for RetryTimeout.
func (w *Worker) retry(ctx context.Context, s int, op string, f func() error) error {
	err := retry.Do(ctx, retry.Policy{First: 20 * time.Millisecond, Max: time.Second, Patience: w.cfg.RetryTimeout,
		Retryable: retry.OnCodes(codes.Unavailable),
		OnRetry: func(attempt int, err error) {
			if attempt == 1 {
				// (After a switch to a hot standby, the process retried.)
				w.cfg.Log.Warn("parameter server unavailable, retrying", "ps", s, "at", w.where(s, op), "op", op, "err", status.Convert(err).Message())
			}
			w.cfg.Metrics.Retries.Inc()
		}}, func(context.Context) error { return f() })
	var gaveUp *retry.GaveUpError
	switch {
	case err == nil || err == ctx.Err():
		return err
	case errors.As(err, &gaveUp):
		return fmt.Errorf("%s to %s: unavailable for %v, giving up: %w", op, w.where(s, op), gaveUp.After.Round(time.Millisecond), gaveUp.Err)
	}
	return fmt.Errorf("%s to %s: %w", op, w.where(s, op), err)
}
