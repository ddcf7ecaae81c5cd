package ps

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/optim"
	"github.com/pstrain/pstrain/ml/vec"
)

// Errors a push can be refused with. The gRPC layer maps them to status
// codes; the shard's state is unchanged by a refused push.
var (
	ErrFutureVersion = errors.New("gradient version is ahead of the shard")
	ErrBadLength     = errors.New("gradient length does not match the shard")
	ErrBadWorker     = errors.New("worker index out of range")
	ErrNonFinite     = errors.New("gradient contains NaN or Inf")
	// ErrPastHold refuses a hold (Membership.HoldAt) at a version the
	// shard has already reached: workers may have pulled it.
	ErrPastHold = errors.New("the shard is already at or past the hold's version")
	// ErrBadMembership refuses a membership naming more worker slots
	// than a run may have (config.MaxWorkerSlots).
	ErrBadMembership = errors.New("membership out of range")
)

// ShardConfig is the Shard state machine's configuration: the update
// rule's part of the Options, with the run's length and the learning
// rate's schedule bound to it (Server.Init builds it).
type ShardConfig struct {
	Mode       config.Mode
	Replicas   int   // sync: gradients per step while all workers live
	Staleness  int   // ssp: how far a worker may run ahead of the slowest
	Workers    int   // worker indices are 0..Workers-1
	MaxVersion int64 // training is done at this version (0: never)
	// LR is the learning rate at each version, set on the optimizer
	// before every update (zero: the optimizer's own rate throughout).
	LR optim.LRSchedule
	// NormGuard is the divergence guard's multiple (0: refuse nothing;
	// see NormGuard).
	NormGuard float64
	// Aggregate is how a sync step combines its gradients (empty: mean).
	Aggregate config.Aggregate
	// Dedupe (shards with a hot standby): in async and ssp mode a
	// gradient whose batch the shard has already counted (its data
	// position is not past the worker's) is a Duplicate: a worker's retry,
	// after a failover, of a push the old primary applied and replicated
	// but never answered. (A sync step already knows its contributors.)
	Dedupe bool
}

// Outcome of a push.
type Outcome int

// Push outcomes.
const (
	Applied   Outcome = iota // applied (async/ssp) or counted into the step (sync)
	Stale                    // sync: computed from an old version; dropped
	Duplicate                // sync: this worker already contributed this step
	// Refused: the norm guard refused it (never applied). A sync step
	// counts it as arrived but leaves it out of the mean, as if its
	// worker had died after pushing; its batch is used up.
	Refused
	// Quarantined: its worker is quarantined (docs/security.md,
	// "Attribution"): never judged, never applied, never counted.
	Quarantined
)

// PushResult says what a push did.
type PushResult struct {
	Outcome   Outcome
	Staleness int64 // shard version at arrival minus the gradient's version
	Advanced  bool  // the push completed a step: the version moved on
	// Wrote says the new parameters were written into the push's Out
	// (Gradient.Out): the step advanced and Out was the parameters'
	// length. Only then does Out hold the new version.
	Wrote bool
	// Norm is the gradient's L2 norm and Ratio its ratio to the norm
	// guard's reference (0 while the guard warms up, or when the
	// gradient was dropped before it was judged).
	Norm, Ratio float64
}

// Stats are the shard's counters since Init.
type Stats struct {
	Applied      int64 // gradients applied or aggregated
	StaleDropped int64
	Duplicates   int64
	Refused      int64 // by the norm guard
	// MaxRatio is the largest norm ratio judged (see PushResult), of
	// worker MaxRatioWorker's gradient from version MaxRatioVersion.
	MaxRatio        float64
	MaxRatioWorker  int
	MaxRatioVersion int64
}

// Outlier is the first finite gradient since Init that a shard found out
// of line: refused by the norm guard, or with a norm ratio beyond
// OutlierRatio (the guard refusing nothing). Non-finite gradients are
// not outliers: never applied, they cannot make a model diverge, and a
// diverged model makes them on every worker.
type Outlier struct {
	Worker  int
	Version int64 // the version it was computed from
	Ratio   float64
}

// Shard is one parameter-server shard's state machine: a flat parameter
// buffer, its optimizer state, a version and the mode's update rule. It is
// plain synchronous code with no locks or goroutines; Server serialises
// calls and wakes blocked pulls when Version changes.
//
// Invariants: Version is the number of updates applied since the initial
// parameters (sync: steps; async/ssp: gradients). In sync mode
// contributors are the workers whose gradients arrived for the current
// version, refused ones included; of the accepted ones, accum holds the
// sum (mean aggregation) or kept[:accepted] copies (trimmed mean). All are
// empty after every advance.
type Shard struct {
	cfg     ShardConfig
	params  []float32
	opt     optim.Optimizer
	version int64
	done    bool

	accum        []float32
	kept         [][]float32 // trimmed mean: room for a step's gradients (keptAt)
	accepted     int         // gradients of the current step in accum or kept
	contributors []int
	after        []int64 // the contributors' data positions once the step is applied
	// counted are the workers whose gradients are in the step's
	// aggregate; lastStep those of the last step applied (LastStep).
	counted, lastStep []int

	guard     *NormGuard
	refused   []int64  // by worker: gradients the norm guard refused since Init
	nonFinite []int64  // by worker: non-finite gradients since Init
	outlier   *Outlier // the first out-of-line gradient since Init
	// agree sums each worker's accepted gradients over the window
	// between two evaluations (attribution); quarantined workers'
	// pushes are refused and their pulls answer done.
	agree       *Agreement
	quarantined []bool

	// Elastic membership (docs/elastic.md). Worker indices below members
	// contribute; a pull from one at or above it waits (a worker about to
	// join) unless the worker is retired (removed: its pulls answer
	// done). holdAt > 0 holds every worker's pull once the version
	// reaches it, until the chief releases the hold (a membership change
	// at that step boundary). The per-worker slices grow with the
	// indices the shard is told of.
	members int
	retired []bool
	holdAt  int64

	live  []bool  // by worker index; all true until told otherwise
	clock []int64 // gradients received per worker (ssp)
	// pos[w] is worker w's data position (see DataPosition); gaps the
	// runs of batches it jumped over (see Gaps).
	pos  []int64
	gaps []Gap

	stats Stats
}

// NewShard starts a shard at version with the given parameters (owned by
// the shard from now on) and optimizer.
func NewShard(cfg ShardConfig, params []float32, opt optim.Optimizer, version int64) (*Shard, error) {
	if cfg.Workers < 1 {
		return nil, fmt.Errorf("ps: shard needs at least one worker, got %d", cfg.Workers)
	}
	if cfg.Mode == config.Sync && (cfg.Replicas < 1 || cfg.Replicas > cfg.Workers) {
		return nil, fmt.Errorf("ps: replicas to aggregate must be in 1..%d, got %d", cfg.Workers, cfg.Replicas)
	}
	if cfg.Aggregate == config.TrimmedMean && cfg.Mode != config.Sync {
		return nil, fmt.Errorf("ps: the trimmed mean aggregates sync steps; mode is %s", cfg.Mode)
	}
	floor := GuardFloorRMS * math.Sqrt(float64(max(1, len(params))))
	s := &Shard{cfg: cfg, params: params, opt: opt, version: version, members: cfg.Workers,
		live: make([]bool, cfg.Workers), clock: make([]int64, cfg.Workers), pos: make([]int64, cfg.Workers),
		retired: make([]bool, cfg.Workers),
		guard:   NewNormGuard(cfg.NormGuard, floor), refused: make([]int64, cfg.Workers), nonFinite: make([]int64, cfg.Workers),
		agree: NewAgreement(params, version), quarantined: make([]bool, cfg.Workers)}
	for i := range s.live {
		s.live[i] = true
	}
	if cfg.Mode == config.Sync {
		s.accum = make([]float32, len(params))
	}
	if cfg.Aggregate == config.TrimmedMean {
		s.kept = make([][]float32, cfg.Replicas)
	}
	s.checkDone()
	return s, nil
}

// LastStep is the workers whose gradients were in the aggregate of the
// last sync step applied (the embedding tables apply the same workers'
// row gradients). Callers must not modify it.
func (s *Shard) LastStep() []int { return s.lastStep }

// Version is the shard's parameter version.
func (s *Shard) Version() int64 { return s.version }

// MaxVersion is the version at which training is done (0: never).
func (s *Shard) MaxVersion() int64 { return s.cfg.MaxVersion }

// Params is the shard's parameter buffer. Callers must not modify it.
func (s *Shard) Params() []float32 { return s.params }

// Optimizer is the shard's optimizer (for snapshots).
func (s *Shard) Optimizer() optim.Optimizer { return s.opt }

// Done reports whether training has ended.
func (s *Shard) Done() bool { return s.done }

// Stats returns the counters.
func (s *Shard) Stats() Stats { return s.stats }

// Refused returns, by worker index, the gradients the norm guard refused
// since the shard was made.
func (s *Shard) Refused() []int64 { return slices.Clone(s.refused) }

// NonFinite returns, by worker index, the gradients holding NaN or Inf
// since the shard was made.
func (s *Shard) NonFinite() []int64 { return slices.Clone(s.nonFinite) }

// Outlier is the first out-of-line gradient since the shard was made
// (nil: none).
func (s *Shard) Outlier() *Outlier { return s.outlier }

// InheritGuard gives the shard the norms of prev's norm guard window
// that belong to its own past (gradients of versions up to the shard's;
// see NormGuard.Inherit), if prev held as many parameters (the same
// shard of the same run, re-initialised).
func (s *Shard) InheritGuard(prev *Shard) {
	if prev != nil && len(prev.params) == len(s.params) {
		s.guard.Inherit(prev.guard, s.version)
	}
}

// Stop ends training: every pull is ready and returns done.
func (s *Shard) Stop() { s.done = true }

// replicas is the number of gradients the current sync step needs: the
// configured number, but never more than the live workers, so a dead
// worker cannot hang the step.
func (s *Shard) replicas() int {
	n := 0
	for w, l := range s.live {
		if l && !s.quarantined[w] {
			n++
		}
	}
	return max(1, min(s.cfg.Replicas, n))
}

// Push delivers worker's gradient computed from parameters at version.
func (s *Shard) Push(worker int, version int64, grad []float32) (PushResult, error) {
	return s.PushAt(worker, version, grad, 0)
}

// PushAt is Push of a gradient computed on the worker's batch at position
// after-1: once the gradient is in the parameters, the worker's data
// position is at least after. after 0 (not known) moves it by one.
//
// A gradient holding NaN or Inf is refused with ErrNonFinite. One the
// norm guard refuses (NormGuard) is not an error: its outcome is Refused
// and it is never applied. In async and ssp mode it changes nothing but
// the worker's clock and data position; a sync step counts it as arrived
// (the worker does not send another) but leaves it out of the step's
// aggregate, like the gradient of a worker that died after pushing.
func (s *Shard) PushAt(worker int, version int64, grad []float32, after int64) (PushResult, error) {
	return s.Take(Gradient{Worker: worker, Version: version, Values: grad, After: after})
}

// Gradient is a push as Shard.Take takes it.
type Gradient struct {
	Worker  int
	Version int64 // the version it was computed from
	Values  []float32
	After   int64 // the worker's data position once it is in the parameters (see PushAt)
	// Out, unless nil (or of another length than the shard's
	// parameters), receives the new parameters when the push moves the
	// version on: the server's next pull snapshot, written in the
	// update's own pass instead of copied from the parameters after it
	// (optim.Step). A push that does not move the version on leaves it
	// as it was.
	Out []float32
	// SumSquares, when Squared, is vec.SumSquares(Values), computed by
	// whoever copied the values in (the data plane: vec.CopySumSquares),
	// so that the shard need not pass over them again for their norm.
	SumSquares float64
	Squared    bool
}

// Take is PushAt of g, with its snapshot buffer and sum of squares.
func (s *Shard) Take(g Gradient) (PushResult, error) {
	worker, version, grad, after, out := g.Worker, g.Version, g.Values, g.After, g.Out
	if len(out) != len(s.params) {
		out = nil
	}
	if err := s.checkPush(worker, version, grad); err != nil {
		return PushResult{}, err
	}
	if s.quarantined[worker] {
		return PushResult{Outcome: Quarantined}, nil
	}
	sq := g.SumSquares
	if !g.Squared {
		sq = sumSquares(grad)
	}
	if !isFinite(sq) {
		s.nonFinite[worker]++
		return PushResult{}, ErrNonFinite
	}
	res := PushResult{Staleness: s.version - version, Norm: math.Sqrt(sq)}
	if out, dropped := s.dropUnjudged(worker, version, after); dropped {
		res.Outcome = out
		return res, nil
	}
	refuse := s.judge(worker, version, &res)
	s.clock[worker]++
	if s.cfg.Mode == config.Sync {
		var g []float32 // the gradient, if it counts
		if !refuse {
			g = grad
		}
		res.Advanced = s.arrive(worker, after, g, out)
		res.Wrote = res.Advanced && out != nil
		return res, nil
	}
	res.Advanced = s.applyNow(worker, after, grad, refuse, out)
	res.Wrote = res.Advanced && out != nil
	return res, nil
}

// checkPush refuses a push the shard cannot take: a worker index out of
// range, a gradient of another length, or one from a future version.
func (s *Shard) checkPush(worker int, version int64, grad []float32) error {
	switch {
	case worker < 0 || worker >= len(s.live):
		return fmt.Errorf("%w: %d (workers: %d)", ErrBadWorker, worker, len(s.live))
	case len(grad) != len(s.params):
		return fmt.Errorf("%w: got %d values, want %d", ErrBadLength, len(grad), len(s.params))
	case version > s.version:
		return fmt.Errorf("%w: gradient from version %d, shard at %d", ErrFutureVersion, version, s.version)
	}
	return nil
}

// dropUnjudged says whether a finite gradient is dropped before the norm
// guard judges it, and as what: Stale when training is over, the worker
// is not (or no longer) a member, or (sync) the step is held for a
// membership change (the gradient changes nothing but is not an error); in sync
// mode Stale when it is from an older version and Duplicate when its
// worker already contributed to the step; with Dedupe in async and ssp
// mode Duplicate when its batch was already counted.
func (s *Shard) dropUnjudged(worker int, version, after int64) (Outcome, bool) {
	isSync := s.cfg.Mode == config.Sync
	switch {
	case s.done || worker >= s.members || s.heldGrads():
		return Stale, true
	case isSync && version < s.version:
		s.stats.StaleDropped++
		return Stale, true
	case isSync && slices.Contains(s.contributors, worker),
		!isSync && s.cfg.Dedupe && after > 0 && after <= s.pos[worker]:
		s.stats.Duplicates++
		return Duplicate, true
	}
	return Applied, false
}

// applyNow applies an async or ssp gradient the guard judged (refused:
// only its batch is used up), counting it into its worker's attribution
// sum and writing the new parameters into out (nil: nowhere) in the same
// pass, and reports whether the version moved on.
func (s *Shard) applyNow(worker int, after int64, grad []float32, refuse bool, out []float32) bool {
	if refuse {
		s.credit(worker, after) // its batch is used up
		return false
	}
	s.setLR()
	optim.Step(s.opt, s.params, grad, 1, s.agree.Sum(worker), out)
	s.version++
	s.credit(worker, after)
	s.checkDone()
	return true
}

// arrive counts worker's gradient g (nil: one that is left out) into the
// current sync step and into the worker's attribution sum, completing
// the step when it has enough (its parameters also written into out,
// unless nil), and reports whether it did.
func (s *Shard) arrive(worker int, after int64, g, out []float32) bool {
	s.contributors = append(s.contributors, worker)
	s.after = append(s.after, after)
	var sum []float32 // the worker's attribution sum, if g counts
	if g != nil {
		s.counted = append(s.counted, worker)
		sum = s.agree.Sum(worker)
	}
	if len(s.contributors) >= s.replicas() {
		s.advance(g, sum, out)
		return true
	}
	s.keep(g, sum)
	return false
}

// Drop accounts for a gradient dropped by policy rather than applied (a
// non-finite one under --nan-policy skip), computed from version on the
// worker's batch at after-1. Its batch is used up. In sync mode it
// counts as arrived but not in the step's aggregate, like a gradient the
// norm guard refused (a stale or duplicate one changes nothing); it
// reports whether that completed the step.
func (s *Shard) Drop(worker int, version, after int64) bool {
	switch {
	case worker < 0 || worker >= s.members || s.done || s.heldGrads():
		return false
	case s.cfg.Mode != config.Sync:
		s.credit(worker, after)
		return false
	case version != s.version || slices.Contains(s.contributors, worker):
		return false
	}
	s.clock[worker]++
	return s.arrive(worker, after, nil, nil)
}

// judge has the norm guard judge a gradient that would otherwise count,
// records its verdict in res and the shard's bookkeeping, and reports
// whether the gradient is refused.
func (s *Shard) judge(worker int, version int64, res *PushResult) bool {
	v := s.guard.Judge(res.Norm)
	res.Ratio = v.Ratio
	if v.Ratio > s.stats.MaxRatio {
		s.stats.MaxRatio, s.stats.MaxRatioWorker, s.stats.MaxRatioVersion = v.Ratio, worker, version
	}
	if v.Refuse || v.Ratio > OutlierRatio {
		s.noteOutlier(worker, version, v.Ratio)
	}
	if v.Refuse {
		s.refused[worker]++
		s.stats.Refused++
		res.Outcome = Refused
		return true
	}
	s.guard.AcceptAt(res.Norm, version)
	s.stats.Applied++
	res.Outcome = Applied
	return false
}

func (s *Shard) noteOutlier(worker int, version int64, ratio float64) {
	if s.outlier == nil {
		s.outlier = &Outlier{Worker: worker, Version: version, Ratio: ratio}
	}
}

// keep adds g (nil: a refused gradient) to the current sync step, and
// into its worker's attribution sum.
func (s *Shard) keep(g, sum []float32) {
	switch {
	case g == nil:
		return
	case s.kept != nil:
		copy(s.keptAt(s.accepted), g)
		vec.Add(sum, g)
	default:
		vec.AddBoth(s.accum, sum, g) // (one pass over g)
	}
	s.accepted++
}

// keptAt is the trimmed mean's room for a step's i-th gradient, made
// when a step first has that many: a shard's memory grows with the
// gradients it was sent, never with the replicas an Init or a membership
// names (thousands of them, each as large as the shard).
func (s *Shard) keptAt(i int) []float32 {
	if s.kept[i] == nil {
		s.kept[i] = make([]float32, len(s.params))
	}
	return s.kept[i]
}

// advance completes the current sync step: it applies the aggregate of
// the step's accepted gradients and last (the completing gradient, nil if
// it was refused or there is none; counted into sum, its worker's
// attribution sum, in the same pass), writes the new parameters into out
// (nil: nowhere), credits the contributors' data positions and moves the
// version on. A step whose gradients were all refused changes no
// parameter.
func (s *Shard) advance(last, sum, out []float32) {
	n := s.accepted
	if last != nil {
		n++
	}
	if n > 0 {
		s.setLR()
	}
	switch {
	case n == 0:
		if out != nil {
			copy(out, s.params)
		}
	case s.kept != nil:
		if last != nil {
			copy(s.keptAt(s.accepted), last)
			vec.Add(sum, last)
		}
		TrimmedMean(s.accum, s.kept[:n])
		optim.Step(s.opt, s.params, s.accum, 1, nil, out)
	case n == 1 && last != nil:
		// A single gradient: apply it directly.
		optim.Step(s.opt, s.params, last, 1, sum, out)
	case last != nil:
		// The last gradient completes the step: add, apply and clear in
		// one pass.
		optim.StepSum(s.opt, s.params, s.accum, last, float32(1/float64(n)), sum, out)
	default:
		optim.Step(s.opt, s.params, s.accum, float32(1/float64(n)), nil, out)
	}
	if s.kept == nil && last == nil {
		clear(s.accum) // (ApplySum cleared it; the trimmed mean overwrites it)
	}
	s.accepted = 0
	s.lastStep, s.counted = append(s.lastStep[:0], s.counted...), s.counted[:0]
	s.creditContributors()
	s.version++
	s.checkDone()
}

// TrimmedMean writes into dst, per coordinate, the mean of the values of
// grads without the largest and the smallest one (one each, whichever
// gradients hold them); with fewer than 3 gradients, the plain mean.
// Equal values are dropped once each, so trimming [1 1 1 5] leaves the
// mean of [1 1]. The values dropped are never added, so one huge value
// cannot swamp the others' precision.
func TrimmedMean(dst []float32, grads [][]float32) {
	m := len(grads)
	if m < 3 {
		inv := 1 / float32(m)
		for i := range dst {
			var sum float32
			for _, g := range grads {
				sum += g[i]
			}
			dst[i] = sum * inv
		}
		return
	}
	inv := 1 / float32(m-2)
	for i := range dst {
		lo, hi := 0, 0
		for k := 1; k < m; k++ {
			v := grads[k][i]
			if v < grads[lo][i] {
				lo = k
			}
			if v > grads[hi][i] {
				hi = k
			}
		}
		if lo == hi { // (only when every value is the same) drop any two
			hi = 1
		}
		var sum float32
		for k, g := range grads {
			if k != lo && k != hi {
				sum += g[i]
			}
		}
		dst[i] = sum * inv
	}
}

// credit moves worker's data position past a gradient now in the
// parameters (see PushAt).
func (s *Shard) credit(worker int, after int64) {
	if after > 0 {
		if after-1 > s.pos[worker] && len(s.gaps) < maxGaps {
			s.gaps = append(s.gaps, Gap{Worker: worker, From: s.pos[worker], To: after - 1})
		}
		s.pos[worker] = max(s.pos[worker], after)
	} else {
		s.pos[worker]++
	}
}

// creditContributors credits the gradients of a sync step just applied
// and empties the step's list.
func (s *Shard) creditContributors() {
	for i, w := range s.contributors {
		s.credit(w, s.after[i])
	}
	s.contributors, s.after = s.contributors[:0], s.after[:0]
}

// maybeAdvance completes the step if it has enough gradients (the live
// workers changed).
func (s *Shard) maybeAdvance() bool {
	n := len(s.contributors)
	if n == 0 || n < s.replicas() {
		return false
	}
	s.advance(nil, nil, nil)
	return true
}

// setLR gives the optimizer the scheduled rate of the update about to
// take the shard from its version to the next.
func (s *Shard) setLR() {
	if !s.cfg.LR.IsZero() {
		s.opt.SetLR(s.cfg.LR.At(s.version))
	}
}

func (s *Shard) checkDone() {
	if s.cfg.MaxVersion > 0 && s.version >= s.cfg.MaxVersion {
		s.done = true
	}
}

// Membership is an elastic run's worker set (docs/elastic.md), as the
// chief sends it: Shard.SetMembership.
type Membership struct {
	Live []int
	// Members: worker indices below it contribute (0: unchanged).
	Members int
	// Retired are indices whose pulls answer done (removed workers).
	Retired []int
	// Replicas is a sync step's gradients with every member live (0:
	// unchanged); MaxVersion the version training ends at (0: unchanged).
	Replicas   int
	MaxVersion int64
	// HoldAt > 0 holds the workers' pulls once the version reaches it;
	// 0 releases any hold. In sync mode a new hold at a version the
	// shard has reached is refused with ErrPastHold (a worker may have
	// pulled it); in async and ssp mode it holds from now on, and the
	// gradients of the pulls answered before still count (see held).
	HoldAt int64
	// Quarantined are the workers the chief quarantined: their pushes
	// are refused and their pulls answer done (the whole set: nil
	// lifts every quarantine).
	Quarantined []int
}

// SetMembership applies m; it reports whether that completed a pending
// sync step. A refused membership (ErrBadMembership) or hold changes
// nothing.
func (s *Shard) SetMembership(m Membership) (bool, error) {
	if err := checkMembership(m); err != nil {
		return false, err
	}
	if s.cfg.Mode == config.Sync && m.HoldAt > 0 && m.HoldAt != s.holdAt && s.version >= m.HoldAt && !s.done {
		return false, fmt.Errorf("%w: hold at %d, shard at %d", ErrPastHold, m.HoldAt, s.version)
	}
	s.holdAt = m.HoldAt
	live := m.Live
	if m.Members > 0 {
		s.grow(m.Members)
		s.members = m.Members
		live = slices.DeleteFunc(slices.Clone(live), func(w int) bool { return w >= s.members })
	}
	s.setRetired(m.Retired)
	s.setQuarantined(m.Quarantined)
	if m.Replicas > 0 {
		s.setReplicas(m.Replicas)
	}
	if m.MaxVersion > 0 {
		s.setMaxVersion(m.MaxVersion)
	}
	return s.SetLive(live), nil
}

// checkMembership refuses a membership whose members, replicas or worker
// indices reach config.MaxWorkerSlots: the shard keeps state for every
// index below the largest (grow), and a trimmed mean room for each of
// the replicas' gradients, so one garbage index near 2^31 would have the
// shard allocate tens of gigabytes.
func checkMembership(m Membership) error {
	const most = config.MaxWorkerSlots
	switch {
	case m.Members < 0 || m.Members > most:
		return fmt.Errorf("%w: %d members, want 0 to %d", ErrBadMembership, m.Members, most)
	case m.Replicas < 0 || m.Replicas > most:
		return fmt.Errorf("%w: %d replicas, want 0 to %d", ErrBadMembership, m.Replicas, most)
	}
	for _, ws := range [][]int{m.Retired, m.Quarantined} {
		if i := slices.IndexFunc(ws, func(w int) bool { return w >= most }); i >= 0 {
			return fmt.Errorf("%w: worker %d, want below %d", ErrBadMembership, ws[i], most)
		}
	}
	return nil
}

// setRetired makes ws the retired workers.
func (s *Shard) setRetired(ws []int) {
	for _, w := range ws {
		s.grow(w + 1)
	}
	clear(s.retired)
	for _, w := range ws {
		if w >= 0 {
			s.retired[w] = true
		}
	}
}

// setReplicas sets a sync step's gradients with every member live to n,
// with room to keep that many (trimmed mean).
func (s *Shard) setReplicas(n int) {
	s.cfg.Replicas = n
	for s.kept != nil && len(s.kept) < n {
		s.kept = append(s.kept, nil) // (keptAt makes it)
	}
}

// setMaxVersion makes v the version training ends at.
func (s *Shard) setMaxVersion(v int64) {
	s.cfg.MaxVersion = v
	if s.cfg.LR.MaxVersion > 0 {
		// The schedule ends at the run's new last step, on every shard
		// alike (a shard restored after the change was built with it).
		s.cfg.LR.MaxVersion = v
	}
	s.checkDone()
}

// grow makes room for worker indices below n.
func (s *Shard) grow(n int) {
	for len(s.live) < n {
		s.live = append(s.live, false)
		s.clock = append(s.clock, 0)
		s.pos = append(s.pos, 0)
		s.retired = append(s.retired, false)
		s.refused = append(s.refused, 0)
		s.nonFinite = append(s.nonFinite, 0)
		s.quarantined = append(s.quarantined, false)
	}
	s.cfg.Workers = max(s.cfg.Workers, n)
}

// held says the shard is at a hold's version: no pull of a worker is
// answered until the chief releases it. In sync mode no gradient counts
// either (the step at the hold is the next layout's or membership's);
// in async and ssp mode the gradients still arriving were computed on
// pulls answered before the hold and count (heldGrads): a change of the
// PS count snapshots the shards once every worker's last push landed
// (docs/elastic.md, "Parameter servers").
func (s *Shard) held() bool { return s.holdAt > 0 && s.version >= s.holdAt }

// heldGrads says a gradient arriving now is dropped for a hold: sync
// mode at a hold's version.
func (s *Shard) heldGrads() bool { return s.cfg.Mode == config.Sync && s.held() }

// Retired says worker was removed from the run, or quarantined: its
// pulls answer done.
func (s *Shard) Retired(worker int) bool {
	return worker >= 0 && worker < len(s.retired) && (s.retired[worker] || s.quarantined[worker])
}

// setQuarantined makes ws the quarantined workers.
func (s *Shard) setQuarantined(ws []int) {
	for _, w := range ws {
		s.grow(w + 1)
	}
	clear(s.quarantined)
	for _, w := range ws {
		if w >= 0 {
			s.quarantined[w] = true
		}
	}
}

// InheritQuarantine keeps prev's quarantined workers (the same shard of
// the same run, re-initialised): a rollback ordered with a quarantine
// never lets the quarantined worker's gradients into the restored model
// before the chief says the membership again.
func (s *Shard) InheritQuarantine(prev *Shard) {
	if prev == nil {
		return
	}
	var ws []int
	for w, q := range prev.quarantined {
		if q {
			ws = append(ws, w)
		}
	}
	s.setQuarantined(ws)
}

// Quarantined says worker is quarantined.
func (s *Shard) Quarantined(worker int) bool {
	return worker >= 0 && worker < len(s.quarantined) && s.quarantined[worker]
}

// CloseWindow ends the attribution window at the current version and
// returns its figures (see Agreement).
func (s *Shard) CloseWindow() Window { return s.agree.Close(s.params, s.version, len(s.live)) }

// Live says the chief counts worker among the live ones.
func (s *Shard) Live(worker int) bool { return worker >= 0 && worker < len(s.live) && s.live[worker] }

// Slots is the number of worker indices the shard keeps state for.
func (s *Shard) Slots() int { return len(s.live) }

// SetLive records which workers are alive. A worker coming back to life
// in ssp mode starts at the slowest live worker's clock, so it neither
// blocks the others nor races ahead. Returns true if the change completed
// a pending sync step.
func (s *Shard) SetLive(workers []int) bool {
	prev := slices.Clone(s.live)
	clear(s.live)
	for _, w := range workers {
		if w >= 0 && w < len(s.live) {
			s.live[w] = true
		}
	}
	// The slowest of the workers that stayed alive sets the returning
	// workers' clocks.
	lo, ok := int64(math.MaxInt64), false
	for w, l := range s.live {
		if l && prev[w] {
			lo, ok = min(lo, s.clock[w]), true
		}
	}
	for w, l := range s.live {
		if ok && l && !prev[w] && s.clock[w] < lo {
			s.clock[w] = lo
		}
	}
	if s.cfg.Mode == config.Sync && !s.done {
		return s.maybeAdvance()
	}
	return false
}

func (s *Shard) minLiveClock() (int64, bool) {
	lo, ok := int64(math.MaxInt64), false
	for w, l := range s.live {
		if l {
			lo, ok = min(lo, s.clock[w]), true
		}
	}
	return lo, ok
}

// PullReady reports whether a pull by worker (-1 for the chief) needing at
// least minVersion can be answered now.
func (s *Shard) PullReady(worker int, minVersion int64) bool {
	if s.done || s.Retired(worker) {
		return true
	}
	if worker >= 0 && (worker >= s.members || s.held()) {
		return false // a worker about to join, or a membership change at this step
	}
	switch s.cfg.Mode {
	case config.Sync:
		return s.version >= minVersion
	case config.SSP:
		if worker < 0 || worker >= len(s.clock) {
			return true
		}
		lo, ok := s.minLiveClock()
		return !ok || s.clock[worker]-lo <= int64(s.cfg.Staleness)
	}
	return true
}

// Clock is the number of gradients received from worker (ssp bookkeeping).
func (s *Shard) Clock(worker int) int64 { return s.clock[worker] }

// DataPosition is worker's position in its data shard in this state: one
// past the furthest of its batches whose gradient the parameters hold (a
// push says which batch, PushAt), starting from the position the shard
// started with (SetDataPositions). A gradient is in the parameters once it
// is applied (async/ssp) or its sync step is; stale and duplicate
// gradients and those after training ended never are. So a snapshot's
// positions match its parameters, and a worker that restarts in the
// middle of a step redoes that batch (its second gradient for the step is
// a duplicate). With backup workers the shards may each drop gradients
// the others counted; the furthest batch, not a count, keeps the position
// right on every shard then, so the largest over the shards is where the
// worker is. Unlike the ssp clock it never jumps when a worker comes back
// to life. worker must be in range.
func (s *Shard) DataPosition(worker int) int64 { return s.pos[worker] }

// Gap is a run of a worker's batches, From..To-1, that a shard's
// position jumped over: their gradients are in no state of this shard
// although the worker went on past them (another shard counted them:
// a backup worker's gradient this shard dropped as stale, a catch-up,
// or the batches a shard restored from a checkpoint missed while the
// others went on). The chief's data ledger counts them as skipped.
type Gap struct {
	Worker   int
	From, To int64
}

// maxGaps bounds the gaps a shard keeps (those beyond are not reported).
const maxGaps = 4096

// Gaps returns the gaps since the shard was made, oldest first, in a new
// slice.
func (s *Shard) Gaps() []Gap { return slices.Clone(s.gaps) }

// DataPositions returns every worker's DataPosition, in a new slice.
func (s *Shard) DataPositions() []int64 {
	out := make([]int64, len(s.pos))
	for w := range out {
		out[w] = s.DataPosition(w)
	}
	return out
}

// SetDataPositions sets the workers' data positions of a shard restored
// from a checkpoint, one per worker, before it takes any gradient.
func (s *Shard) SetDataPositions(pos []int64) error {
	if len(pos) != len(s.pos) {
		return fmt.Errorf("ps: %d data positions for %d workers", len(pos), len(s.pos))
	}
	if i := slices.IndexFunc(pos, func(p int64) bool { return p < 0 }); i >= 0 {
		return fmt.Errorf("ps: worker %d's data position %d is negative", i, pos[i])
	}
	copy(s.pos, pos)
	return nil
}
