package ps

import (
	"fmt"
	"slices"

	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// ShardState is the part of a Shard's state machine that an Init does not
// rebuild from its request (parameters, optimizer state, version, options):
// the sync step under way, the membership, the norm guard's window, the
// per-worker bookkeeping and the counters. With it a hot standby becomes an
// exact copy of its primary at any moment, mid-step included, so the same
// updates applied to both leave them bit for bit equal
// (docs/replication.md). It travels as ReplicaSnapshot.shard_state (Proto).
type ShardState struct {
	// The configuration a membership change moves.
	Replicas     int
	Workers      int
	MaxVersion   int64
	LRMaxVersion int64
	Done         bool
	// The sync step under way: the sum of its accepted gradients (mean
	// aggregation) or their copies (trimmed mean), as float32 bytes.
	Accum        []byte
	Kept         [][]byte
	Accepted     int
	Contributors []int
	After        []int64
	// Counted are the workers whose gradients are in the step's
	// aggregate so far (Shard.LastStep once the step is applied).
	Counted []int
	// The norm guard's window.
	GuardWindow []float64
	GuardNext   int
	GuardRef    float64
	// GuardVersions are the versions the window's gradients came from.
	GuardVersions []int64
	// Quarantined workers (by index).
	Quarantined []bool
	// Per worker.
	Refused   []int64
	NonFinite []int64
	Retired   []bool
	Live      []bool
	Clock     []int64
	Pos       []int64
	Members   int
	HoldAt    int64
	Outlier   *Outlier
	Stats     Stats
}

// State copies the shard's ShardState.
func (s *Shard) State() ShardState {
	st := ShardState{Replicas: s.cfg.Replicas, Workers: s.cfg.Workers, MaxVersion: s.cfg.MaxVersion,
		LRMaxVersion: s.cfg.LR.MaxVersion, Done: s.done, Accepted: s.accepted,
		Contributors: slices.Clone(s.contributors), After: slices.Clone(s.after), Counted: slices.Clone(s.counted),
		GuardWindow: slices.Clone(s.guard.window), GuardNext: s.guard.next, GuardRef: s.guard.ref,
		GuardVersions: slices.Clone(s.guard.vers), Quarantined: slices.Clone(s.quarantined),
		Refused: slices.Clone(s.refused), NonFinite: slices.Clone(s.nonFinite), Retired: slices.Clone(s.retired),
		Live: slices.Clone(s.live), Clock: slices.Clone(s.clock), Pos: slices.Clone(s.pos),
		Members: s.members, HoldAt: s.holdAt, Stats: s.stats}
	if s.outlier != nil {
		o := *s.outlier
		st.Outlier = &o
	}
	if s.accepted > 0 && s.kept == nil {
		st.Accum = slices.Clone(wire.Bytes(s.accum))
	}
	for _, k := range s.kept[:min(s.accepted, len(s.kept))] {
		st.Kept = append(st.Kept, slices.Clone(wire.Bytes(k)))
	}
	return st
}

// SetState makes st the shard's state. The shard must be freshly built
// (NewShard) from the same Init as the one st was taken from: same
// parameters count, mode and aggregation.
func (s *Shard) SetState(st ShardState) error {
	if err := s.checkState(st); err != nil {
		return err
	}
	s.grow(len(st.Live))
	if st.Replicas > 0 {
		s.setReplicas(st.Replicas) // as a membership change would: room for the step's gradients
	}
	if st.Accepted > 0 {
		if err := s.setStep(st); err != nil {
			return err
		}
	}
	s.cfg.Workers, s.cfg.MaxVersion, s.cfg.LR.MaxVersion = st.Workers, st.MaxVersion, st.LRMaxVersion
	s.done, s.accepted = st.Done, st.Accepted
	s.contributors, s.after = append(s.contributors[:0], st.Contributors...), append(s.after[:0], st.After...)
	s.counted = append(s.counted[:0], st.Counted...)
	s.guard.restore(st.GuardWindow, st.GuardVersions, st.GuardNext, st.GuardRef)
	copy(s.quarantined, st.Quarantined)
	copy(s.refused, st.Refused)
	copy(s.nonFinite, st.NonFinite)
	copy(s.retired, st.Retired)
	copy(s.live, st.Live)
	copy(s.clock, st.Clock)
	copy(s.pos, st.Pos)
	s.members, s.holdAt, s.stats = st.Members, st.HoldAt, st.Stats
	s.outlier = nil
	if st.Outlier != nil {
		o := *st.Outlier
		s.outlier = &o
	}
	return nil
}

// checkState refuses a state that does not fit the shard: per-worker
// lists of different lengths or fewer workers than the shard has, a
// sync step whose lists disagree, or a norm-guard window the guard
// cannot hold.
func (s *Shard) checkState(st ShardState) error {
	n := len(st.Live)
	for _, l := range []int{len(st.Refused), len(st.NonFinite), len(st.Retired), len(st.Clock), len(st.Pos)} {
		if l != n {
			return fmt.Errorf("ps: shard state: per-worker lists of different lengths (%d, %d)", n, l)
		}
	}
	if n < len(s.live) || len(st.Contributors) != len(st.After) || st.Accepted < 0 || st.Accepted > len(st.Contributors) {
		return fmt.Errorf("ps: shard state: %d workers (the shard has %d), %d contributors with %d positions, %d accepted",
			n, len(s.live), len(st.Contributors), len(st.After), st.Accepted)
	}
	if err := checkCounted(st, n); err != nil {
		return err
	}
	if n > config.MaxWorkerSlots || st.Replicas < 0 || st.Replicas > config.MaxWorkerSlots {
		// As a membership may not (checkMembership): slots and the
		// trimmed mean's room are allocated for these.
		return fmt.Errorf("ps: shard state: %d workers and %d replicas, want at most %d of each", n, st.Replicas, config.MaxWorkerSlots)
	}
	if len(st.GuardWindow) > cap(s.guard.window) || st.GuardNext < 0 || st.GuardNext >= max(1, cap(s.guard.window)) {
		return fmt.Errorf("ps: shard state: a norm-guard window of %d (next %d), the guard keeps %d", len(st.GuardWindow), st.GuardNext, cap(s.guard.window))
	}
	return nil
}

// restore makes the guard's window the norms window from versions vers
// (a version missing from vers is 0), its next slot next and its
// reference ref: the state ShardState carries. The window must fit the
// guard's (Shard.SetState checks it).
func (g *NormGuard) restore(window []float64, vers []int64, next int, ref float64) {
	g.window = append(g.window[:0], window...)
	g.vers = append(g.vers[:0], vers...)
	for len(g.vers) < len(g.window) {
		g.vers = append(g.vers, 0)
	}
	g.vers = g.vers[:len(g.window)]
	g.next, g.ref = next, ref
}

// setStep restores the accepted gradients of the sync step under way.
func (s *Shard) setStep(st ShardState) error {
	if s.kept == nil {
		g, err := wire.Floats(st.Accum)
		if err != nil || len(g) != len(s.accum) {
			return fmt.Errorf("ps: shard state: a step sum of %d bytes for %d parameters (%v)", len(st.Accum), len(s.accum), err)
		}
		copy(s.accum, g)
		return nil
	}
	if len(st.Kept) != st.Accepted || st.Accepted > len(s.kept) {
		return fmt.Errorf("ps: shard state: %d kept gradients for %d accepted (room for %d)", len(st.Kept), st.Accepted, len(s.kept))
	}
	for i, b := range st.Kept {
		g, err := wire.Floats(b)
		if err != nil || len(g) != len(s.params) {
			return fmt.Errorf("ps: shard state: kept gradient %d of %d bytes for %d parameters (%v)", i, len(b), len(s.params), err)
		}
		copy(s.keptAt(i), g)
	}
	return nil
}

// checkCounted refuses a step's counted workers that are not among its
// contributors, of n workers.
func checkCounted(st ShardState, n int) error {
	for _, w := range st.Counted {
		if w < 0 || w >= n || !slices.Contains(st.Contributors, w) {
			return fmt.Errorf("ps: shard state: worker %d counted in the step, not one of its %d contributors of %d workers", w, len(st.Contributors), n)
		}
	}
	return nil
}

// Proto is st as ReplicaSnapshot.shard_state.
func (st ShardState) Proto() *pb.ShardState {
	m := &pb.ShardState{Replicas: int32(st.Replicas), Workers: int32(st.Workers), MaxVersion: st.MaxVersion,
		LrMaxVersion: st.LRMaxVersion, Done: st.Done, Accum: st.Accum, Kept: st.Kept, Accepted: int32(st.Accepted),
		Contributors: int32s(st.Contributors), After: st.After, Counted: int32s(st.Counted),
		GuardWindow: st.GuardWindow, GuardNext: int32(st.GuardNext), GuardRef: st.GuardRef, GuardVersions: st.GuardVersions,
		Quarantined: st.Quarantined, Refused: st.Refused, NonFinite: st.NonFinite, Retired: st.Retired, Live: st.Live,
		Clock: st.Clock, Pos: st.Pos, Members: int32(st.Members), HoldAt: st.HoldAt,
		Stats: &pb.ShardStats{Applied: st.Stats.Applied, StaleDropped: st.Stats.StaleDropped, Duplicates: st.Stats.Duplicates,
			Refused: st.Stats.Refused, MaxRatio: st.Stats.MaxRatio, MaxRatioWorker: int32(st.Stats.MaxRatioWorker),
			MaxRatioVersion: st.Stats.MaxRatioVersion}}
	if st.Outlier != nil {
		m.Outlier = &pb.Outlier{Worker: int32(st.Outlier.Worker), Version: st.Outlier.Version, Ratio: st.Outlier.Ratio}
	}
	return m
}

// shardStateFromProto reads ReplicaSnapshot.shard_state; Shard.SetState
// checks it.
func shardStateFromProto(m *pb.ShardState) ShardState {
	st := ShardState{Replicas: int(m.GetReplicas()), Workers: int(m.GetWorkers()), MaxVersion: m.GetMaxVersion(),
		LRMaxVersion: m.GetLrMaxVersion(), Done: m.GetDone(), Accum: m.GetAccum(), Kept: m.GetKept(),
		Accepted: int(m.GetAccepted()), Contributors: ints(m.GetContributors()), After: m.GetAfter(), Counted: ints(m.GetCounted()),
		GuardWindow: m.GetGuardWindow(), GuardNext: int(m.GetGuardNext()), GuardRef: m.GetGuardRef(),
		GuardVersions: m.GetGuardVersions(), Quarantined: m.GetQuarantined(), Refused: m.GetRefused(),
		NonFinite: m.GetNonFinite(), Retired: m.GetRetired(), Live: m.GetLive(), Clock: m.GetClock(), Pos: m.GetPos(),
		Members: int(m.GetMembers()), HoldAt: m.GetHoldAt()}
	if s := m.GetStats(); s != nil {
		st.Stats = Stats{Applied: s.Applied, StaleDropped: s.StaleDropped, Duplicates: s.Duplicates, Refused: s.Refused,
			MaxRatio: s.MaxRatio, MaxRatioWorker: int(s.MaxRatioWorker), MaxRatioVersion: s.MaxRatioVersion}
	}
	if o := m.GetOutlier(); o != nil {
		st.Outlier = &Outlier{Worker: int(o.Worker), Version: o.Version, Ratio: o.Ratio}
	}
	return st
}

func int32s(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

func ints(xs []int32) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}
