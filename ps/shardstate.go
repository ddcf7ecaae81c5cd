package ps

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/pstrain/pstrain/transport/wire"
)

// ShardState is the part of a Shard's state machine that an Init does not
// rebuild from its request (parameters, optimizer state, version, options):
// the sync step under way, the membership, the norm guard's window, the
// per-worker bookkeeping and the counters. With it a hot standby becomes an
// exact copy of its primary at any moment, mid-step included, so the same
// updates applied to both leave them bit for bit equal
// (docs/replication.md). It travels as JSON in ReplicaSnapshot.shard_state.
type ShardState struct {
	// The configuration a membership change moves.
	Replicas     int   `json:"replicas"`
	Workers      int   `json:"workers"`
	MaxVersion   int64 `json:"max_version"`
	LRMaxVersion int64 `json:"lr_max_version"`
	Done         bool  `json:"done"`
	// The sync step under way: the sum of its accepted gradients (mean
	// aggregation) or their copies (trimmed mean), as float32 bytes.
	Accum        []byte   `json:"accum,omitempty"`
	Kept         [][]byte `json:"kept,omitempty"`
	Accepted     int      `json:"accepted"`
	Contributors []int    `json:"contributors,omitempty"`
	After        []int64  `json:"after,omitempty"`
	// The norm guard's window.
	GuardWindow []float64 `json:"guard_window"`
	GuardNext   int       `json:"guard_next"`
	GuardRef    float64   `json:"guard_ref"`
	// GuardVersions are the versions the window's gradients came from.
	GuardVersions []int64 `json:"guard_versions,omitempty"`
	// Quarantined workers (by index).
	Quarantined []bool `json:"quarantined,omitempty"`
	// Per worker.
	Refused   []int64  `json:"refused"`
	NonFinite []int64  `json:"non_finite"`
	Retired   []bool   `json:"retired"`
	Live      []bool   `json:"live"`
	Clock     []int64  `json:"clock"`
	Pos       []int64  `json:"pos"`
	Members   int      `json:"members"`
	HoldAt    int64    `json:"hold_at"`
	Outlier   *Outlier `json:"outlier,omitempty"`
	Stats     Stats    `json:"stats"`
}

// State copies the shard's ShardState.
func (s *Shard) State() ShardState {
	st := ShardState{Replicas: s.cfg.Replicas, Workers: s.cfg.Workers, MaxVersion: s.cfg.MaxVersion,
		LRMaxVersion: s.cfg.LR.MaxVersion, Done: s.done, Accepted: s.accepted,
		Contributors: slices.Clone(s.contributors), After: slices.Clone(s.after),
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
	if len(st.GuardWindow) > cap(s.guard.window) || st.GuardNext < 0 || st.GuardNext >= max(1, cap(s.guard.window)) {
		return fmt.Errorf("ps: shard state: a norm-guard window of %d (next %d), the guard keeps %d", len(st.GuardWindow), st.GuardNext, cap(s.guard.window))
	}
	s.grow(n)
	if st.Replicas > 0 {
		// As a membership change would: room for the step's gradients.
		s.cfg.Replicas = st.Replicas
		for s.kept != nil && len(s.kept) < st.Replicas {
			s.kept = append(s.kept, make([]float32, len(s.params)))
		}
	}
	if st.Accepted > 0 {
		if err := s.setStep(st); err != nil {
			return err
		}
	}
	s.cfg.Workers, s.cfg.MaxVersion, s.cfg.LR.MaxVersion = st.Workers, st.MaxVersion, st.LRMaxVersion
	s.done, s.accepted = st.Done, st.Accepted
	s.contributors, s.after = append(s.contributors[:0], st.Contributors...), append(s.after[:0], st.After...)
	s.guard.window = append(s.guard.window[:0], st.GuardWindow...)
	s.guard.vers = append(s.guard.vers[:0], st.GuardVersions...)
	for len(s.guard.vers) < len(s.guard.window) {
		s.guard.vers = append(s.guard.vers, 0)
	}
	s.guard.vers = s.guard.vers[:len(s.guard.window)]
	s.guard.next, s.guard.ref = st.GuardNext, st.GuardRef
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
		copy(s.kept[i], g)
	}
	return nil
}

// encodeShardState is st as ReplicaSnapshot.shard_state.
func encodeShardState(st ShardState) ([]byte, error) {
	b, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("ps: shard state: %w", err)
	}
	return b, nil
}

func decodeShardState(b []byte) (ShardState, error) {
	var st ShardState
	if err := json.Unmarshal(b, &st); err != nil {
		return ShardState{}, fmt.Errorf("ps: shard state: %w", err)
	}
	return st, nil
}
