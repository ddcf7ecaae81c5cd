package worker

import (
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/ps"
)

// Core is a worker's training loop as a plain synchronous state
// machine, in the manner of etcd's raft and of chief.Core: what happened
// comes in through its methods (a pull answered, a push answered, the
// passes done, a row block of the gradient final), each with the time,
// and what to do next goes out as Actions (pull, push, compute, move the
// data source). It does no I/O, starts no goroutine and reads no clock;
// Worker.Run is the driver that carries out its actions and feeds it
// their outcomes. It is not safe for concurrent use. doc.go describes
// its states and the order of its actions.
type Core struct {
	p   CoreParams
	log *slog.Logger

	state state
	// views and positions are what each shard's latest pull answered:
	// the parameters' version and generation, and the number of this
	// worker's batches whose gradients the shard holds.
	views     []ps.PullView
	positions []int64
	// tags are the views a step's gradient was computed from, kept for
	// its pushes while the next step's pulls overwrite views.
	tags []ps.PullView
	// minVersion is the version every shard must reach before a step
	// (sync): the last step's, or the one a catch-up brings them to.
	minVersion int64
	// next is the data position the batch source is at (-1: not known
	// before the first answers).
	next  int64
	steps int64
	loss  float32
	align ps.Alignment // what the settled pulls decided

	round     *round       // the pull round under way; nil: none
	settled   *pullOutcome // the next step's pulls, settled before its pushes were answered
	pushes    *pushes      // the pushes under way; nil: none
	failure   error        // draining: what Finish will say
	pullSince time.Time    // when the step's pull phase began
	computeAt time.Time    // when its passes began
	pushSince time.Time    // when its pushes began

	early  earlyPushes
	head   headStart
	reads  inPlaceReads
	faults faults
}

// CoreParams is what a Core is built from; Worker.New derives it from
// the Config, the plan and what the net and the data plane support.
type CoreParams struct {
	Index  int
	Mode   config.Mode
	Shards int
	// Overlap: the next step's pulls go out with a step's pushes, each
	// on a client of its own (Shard.Puller), and wait at their shards.
	Overlap bool
	// EarlyRows and EarlyReady: the first layer's row blocks the net
	// announces, and the shards that may be pushed at each (earlyPlan);
	// empty: no early pushes.
	EarlyRows  []int
	EarlyReady [][]int
	// HeadStart: the first layer's row blocks, top first, with their
	// shards (headStartPlan); empty: no step starts ahead.
	HeadStart []headBlock
	// InPlace says, by shard, that the net reads its parameters where its
	// pulls leave them; nil: none.
	InPlace []bool
	// Faults are this worker's gradient faults.
	Faults []GradientFault
}

// state is where a Core is in a step.
type state int

const (
	// pulling: the step's pull rounds are under way.
	pulling state = iota
	// computing: the step's passes run (Compute out, Computed in).
	computing
	// catchingUp: a catch-up gradient is computed or pushed.
	catchingUp
	// pushing: the step's pushes are under way, with Overlap the next
	// step's pulls too.
	pushing
	// draining: Run fails; the calls under way are waited for.
	draining
	// finished: Finish was returned.
	finished
)

func (s state) String() string {
	return [...]string{"pulling", "computing", "catching-up", "pushing", "draining", "finished"}[s]
}

// PullAnswer is the outcome of one pull of a PullRound.
type PullAnswer struct {
	Shard      int
	Version    int64
	Generation int64
	Done       bool
	// Position is the number of this worker's batches whose gradients
	// the shard holds.
	Position int64
	// Placed says the net now reads the shard's parameters in place,
	// where the pull left them (else from its weights).
	Placed bool
	// Stalled says the pull was bounded and its bound passed first.
	Stalled bool
	Err     error
}

// PushResult is what a shard did with a push.
type PushResult int

const (
	// PushCounted: the gradient was applied or aggregated.
	PushCounted PushResult = iota
	// PushDropped: stale or a duplicate; the shard's data position says
	// the batch is still to be used.
	PushDropped
	// PushRefused: the shard refuses this worker's gradients. The core
	// reports it (StepDone.Refused) and goes on; what to do about a
	// worker whose pushes are refused is the shard's and the chief's
	// policy.
	PushRefused
)

// PushOutcome is the outcome of one shard's push.
type PushOutcome struct {
	Shard  int
	Result PushResult
	Err    error
}

// round is a pull round under way.
type round struct {
	first   bool // the first of its step (the step started ahead reads it)
	next    bool // the next step's, sent with this step's pushes
	waiting int  // pulls not answered yet
	errs    []error
	cut     bool // CancelPulls was sent
}

// pullOutcome is what a step's pull rounds settled on.
type pullOutcome struct {
	a   ps.Alignment
	err error
}

// pushes are the pushes under way, those of one step or catch-up.
type pushes struct {
	waiting int
	errs    []error
	refused []int
}

// NewCore is a core about to start; Start sends its first pulls.
func NewCore(p CoreParams, log *slog.Logger) *Core {
	c := &Core{p: p, log: log, views: make([]ps.PullView, p.Shards), positions: make([]int64, p.Shards),
		tags: make([]ps.PullView, p.Shards), next: -1}
	c.early = newEarlyPushes(p)
	c.head = newHeadStart(p)
	c.reads = newInPlaceReads(p)
	for _, f := range p.Faults {
		c.faults.list = append(c.faults.list, f)
		c.faults.fired = append(c.faults.fired, false)
	}
	return c
}

// Start is the first step's pulls, at any version.
func (c *Core) Start(now time.Time) []Action {
	c.pullSince = now
	return c.startPulls(false)
}

// startPulls is a step's first pull round: every shard at minVersion.
// Whatever was computed or loaded ahead before is dropped (its
// parameters are about to be overwritten, and its batch was read before
// this round's answers).
func (c *Core) startPulls(next bool) []Action {
	acts := c.head.open(c.next)
	pulls := make([]ps.Pull, c.p.Shards)
	for s := range pulls {
		pulls[s] = ps.Pull{Shard: s, MinVersion: c.minVersion}
	}
	return append(acts, c.sendRound(pulls, true, next))
}

// sendRound is a PullRound of pulls.
func (c *Core) sendRound(pulls []ps.Pull, first, next bool) Action {
	r := PullRound{Next: next}
	for _, p := range pulls {
		r.Pulls = append(r.Pulls, PullOrder{Pull: p, Generation: c.views[p.Shard].Generation})
		c.reads.pullSent(p.Shard)
	}
	c.round = &round{first: first, next: next, waiting: len(pulls)}
	if !next {
		c.state = pulling
	}
	return r
}

// Pulled is one pull's answer.
func (c *Core) Pulled(now time.Time, ans PullAnswer) []Action {
	r := c.round
	r.waiting--
	var acts []Action
	s := ans.Shard
	switch {
	case ans.Err != nil:
		r.errs = append(r.errs, ans.Err)
	case ans.Stalled:
		c.views[s].Stalled = true
	case c.state == draining:
		c.reads.answered(s, ans.Placed) // (the net reads it where it is)
	default:
		c.reads.answered(s, ans.Placed)
		if ans.Generation != c.views[s].Generation && c.views[s].Generation != 0 {
			c.log.Warn("parameter server state replaced by the chief", "ps", s, "generation", ans.Generation, "version", ans.Version)
		}
		c.views[s] = ps.PullView{Version: ans.Version, Generation: ans.Generation, Done: ans.Done}
		c.positions[s] = ans.Position
		if ans.Done && !r.cut {
			r.cut = true
			acts = append(acts, CancelPulls{})
		} else if !ans.Done && r.first {
			acts = append(acts, c.head.answered(s, c.next)...)
		}
	}
	if r.waiting > 0 || c.head.busy {
		return acts
	}
	return append(acts, c.roundEnd(now)...)
}

// HeadStarted says the HeadStart computed n row blocks.
func (c *Core) HeadStarted(now time.Time, n int) []Action {
	c.head.computed(n)
	if c.round != nil && c.round.waiting == 0 {
		return c.roundEnd(now)
	}
	return nil
}

// roundEnd applies ps.Align to a finished round's answers: another
// round of the shards it names, or the step's pulls are settled.
func (c *Core) roundEnd(now time.Time) []Action {
	r := c.round
	c.round = nil
	if c.state == draining {
		return c.drained()
	}
	a := ps.Align(c.p.Mode, c.views)
	var acts []Action
	if r.first {
		acts = c.head.close(a)
	}
	switch {
	case a.Action == ps.AlignDone: // the other pulls were cancelled
		return append(acts, c.settle(now, pullOutcome{a: a}, r.next)...)
	case len(r.errs) > 0:
		return append(acts, c.settle(now, pullOutcome{err: errors.Join(r.errs...)}, r.next)...)
	case a.Action == ps.AlignPull:
		// A pull of this round may fail or be cut short: what the net
		// reads in place of the shards pulled again is copied first.
		for _, p := range a.Pulls {
			acts = append(acts, c.reads.keep(p.Shard)...)
		}
		return append(acts, c.sendRound(a.Pulls, false, r.next))
	}
	return append(acts, c.settle(now, pullOutcome{a: a}, r.next)...)
}

// settle acts on what a step's pulls decided; the next step's pulls
// (next) wait for the step's pushes to be answered.
func (c *Core) settle(now time.Time, o pullOutcome, next bool) []Action {
	if next {
		c.settled = &o
		if c.pushes == nil {
			return c.afterOverlap(now)
		}
		return nil
	}
	return c.decide(now, o)
}

// decide acts on a step's settled pulls: done, failed, a catch-up or
// the step.
func (c *Core) decide(now time.Time, o pullOutcome) []Action {
	switch {
	case o.a.Action == ps.AlignDone:
		c.log.Info("training done", "worker", c.p.Index, "steps", c.steps, "early_pushes", c.early.count, "steps_started_ahead", c.head.count)
		return c.finish(nil)
	case o.err != nil:
		return c.fail(o.err)
	}
	c.align = o.a
	if o.a.Action == ps.AlignCatchUp {
		c.log.Warn("parameter server stuck behind the others: pushing it a catch-up gradient (a worker died between its pushes?)",
			"worker", c.p.Index, "ps", o.a.CatchUp, "version", c.views[o.a.CatchUp[0]].Version, "others_at", o.a.Version)
		c.state = catchingUp
		return c.compute()
	}
	c.state = computing
	c.computeAt = now
	acts := []Action{Phase{Name: metrics.PhasePull, Step: c.steps, Took: now.Sub(c.pullSince)}}
	c.pushes = &pushes{}
	c.early.arm(c.views)
	return append(acts, c.compute()...)
}

// compute is the passes on the batch at the data position: one past the
// furthest batch of this worker's that some shard holds. The step may
// start from what was computed ahead on that batch.
func (c *Core) compute() []Action {
	pos := slices.Max(c.positions)
	took, acts := c.head.take(pos, c.next, c.state == computing)
	if took {
		c.next = pos + 1 // the batch is in the input already
		return append(acts, Compute{Views: slices.Clone(c.views)})
	}
	if pos != c.next {
		switch {
		case c.next < 0:
			c.log.Info("data position", "worker", c.p.Index, "batch", pos)
		case pos == c.next-1:
			// No shard counted the last gradient (stale everywhere, e.g.
			// a backup worker's that lost the race, or a duplicate
			// catch-up): no sample of it is in the model yet.
			c.log.Debug("gradient not counted; using its batch again", "worker", c.p.Index, "batch", pos)
		default:
			c.log.Warn("data position moved by the parameter servers (a rollback to a checkpoint?)", "worker", c.p.Index, "from", c.next, "to", pos)
		}
		acts = append(acts, Seek{Position: pos})
		c.next = pos
	}
	c.next++
	return append(acts, Compute{Load: true, Views: slices.Clone(c.views)})
}

// RowsFinal is the net's announcement, during a step's Compute, that
// the first layer's gradient is final from row up: the shards then
// final are pushed now.
func (c *Core) RowsFinal(row int, loss float32) []Action {
	shards := c.early.ready(row)
	if len(shards) == 0 {
		return nil
	}
	c.pushes.waiting += len(shards)
	return []Action{Push{Kind: EarlyPush, Step: c.steps, Shards: shards, Tags: c.early.tags, DataPosition: c.next, Loss: loss, Scale: 1}}
}

// Computed says the passes are done: loss, or err.
func (c *Core) Computed(now time.Time, loss float32, err error) []Action {
	sent := c.early.disarm()
	if err != nil {
		return c.fail(err)
	}
	if c.state == catchingUp {
		c.pushes = &pushes{waiting: len(c.align.CatchUp)}
		copy(c.tags, c.views)
		return []Action{Push{Kind: CatchUpPush, Step: c.steps, Shards: c.align.CatchUp, Tags: c.tags, DataPosition: c.next, Loss: loss, Scale: 1}}
	}
	c.state = pushing
	c.loss = loss
	c.pushSince = now
	acts := []Action{Phase{Name: metrics.PhaseCompute, Step: c.steps, Took: now.Sub(c.computeAt)}}
	var rest []int
	for s := range c.p.Shards {
		if sent == nil || !sent[s] {
			rest = append(rest, s)
		}
	}
	copy(c.tags, c.views)
	c.pushes.waiting += len(rest)
	acts = append(acts, Push{Kind: StepPush, Step: c.steps, Shards: rest, Tags: c.tags, DataPosition: c.next, Loss: loss, Scale: c.scale()})
	if c.p.Mode == config.Sync {
		c.minVersion = c.align.Version + 1 // the step's version on every shard
	}
	if c.p.Overlap {
		c.settled = nil
		acts = append(acts, c.startPulls(true)...)
	}
	if c.pushes.waiting == 0 { // (no shard to push: answered already)
		c.pushes = nil
		acts = append(acts, c.stepPushed(now, nil, nil)...)
	}
	return acts
}

// scale is the step's gradient fault factor (1: none), computed from
// the highest version the pulls answered.
func (c *Core) scale() float32 {
	if len(c.faults.list) == 0 {
		return 1
	}
	var version int64
	for _, v := range c.views {
		version = max(version, v.Version)
	}
	k := c.faults.scale(version)
	if k != 1 && !c.faults.logged {
		c.faults.logged = true // (once: an every-step fault would flood the log)
		c.log.Warn("fault injection (--fault-gradient): scaling this worker's gradient", "worker", c.p.Index, "version", version, "scale", k)
	}
	return k
}

// Pushed is one push's answer.
func (c *Core) Pushed(now time.Time, out PushOutcome) []Action {
	p := c.pushes
	p.waiting--
	if out.Err != nil {
		p.errs = append(p.errs, out.Err)
	}
	if out.Result == PushRefused {
		p.refused = append(p.refused, out.Shard)
	}
	if p.waiting > 0 || c.state == computing {
		return nil // (early pushes answered before the passes ended)
	}
	c.pushes = nil
	err := errors.Join(p.errs...)
	switch c.state {
	case draining:
		c.failure = errors.Join(c.failure, err)
		return c.drained()
	case catchingUp:
		if err != nil {
			return c.fail(err)
		}
		c.minVersion = c.align.Version // every shard, the lagging ones once caught up
		c.pullSince = now
		return c.startPulls(false)
	}
	return c.stepPushed(now, err, p.refused)
}

// stepPushed is the end of a step's pushes.
func (c *Core) stepPushed(now time.Time, err error, refused []int) []Action {
	if err != nil {
		copy(c.views, c.tags)
		return c.fail(err) // the step may never complete without this push
	}
	c.steps++
	acts := []Action{
		Phase{Name: metrics.PhasePush, Step: c.steps - 1, Took: now.Sub(c.pushSince)},
		StepDone{Steps: c.steps, Loss: c.loss, HeadStarted: c.head.used, Refused: refused},
	}
	c.pullSince = now
	if !c.p.Overlap {
		return append(acts, c.startPulls(false)...)
	}
	if c.settled != nil {
		return append(acts, c.afterOverlap(now)...)
	}
	c.state = pulling // the next step's pulls, under way
	return acts
}

// afterOverlap acts on the next step's pulls once the step's pushes are
// answered. Only what a pull sent after the pushes would give is kept:
// a step at minVersion or later. Anything else (a shard restarted
// meanwhile, a rollback, a catch-up, done, an error) is pulled again,
// from the views the step's pushes were tagged with.
func (c *Core) afterOverlap(now time.Time) []Action {
	o := *c.settled
	c.settled = nil
	if o.err != nil || o.a.Action != ps.AlignStep || o.a.Version < c.minVersion {
		copy(c.views, c.tags)
		return c.startPulls(false)
	}
	return c.decide(now, o)
}

// fail ends Run with err once the calls under way are answered.
func (c *Core) fail(err error) []Action {
	c.state = draining
	c.failure = err
	var acts []Action
	if c.round != nil && !c.round.cut {
		c.round.cut = true
		acts = append(acts, CancelPulls{})
	}
	return append(acts, c.drained()...)
}

// drained is Finish if nothing is under way any more.
func (c *Core) drained() []Action {
	if c.round != nil || (c.pushes != nil && c.pushes.waiting > 0) {
		return nil
	}
	c.pushes = nil
	return c.finish(c.failure)
}

// finish is Run's end: the net reads its weights again, with the
// shards' last answers copied into them where they are still mapped.
func (c *Core) finish(err error) []Action {
	c.state = finished
	return append(c.reads.release(), Finish{Err: err})
}
