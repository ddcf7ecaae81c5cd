package chief

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pstrain/pstrain/observe/report"
)

// Action is a decision of the Core for Chief.Run to carry out. Actions
// are carried out in the order they are returned; those that report back
// (InitCluster, Restore, Evaluate, Checkpoint, StopShards) do so through
// the Core method named in their comment.
type Action interface {
	fmt.Stringer
	action()
}

// InitCluster initialises every shard at the start of a run, in
// Generation: from the newest valid checkpoint of this run if Resume is
// set and there is one, else from the seed. Answered by Core.Started.
type InitCluster struct {
	Generation int64
	Resume     bool
}

// Restore re-initialises Shards from the newest valid checkpoint (the
// initial weights if there is none), in Generation, with the data
// positions the checkpoint holds. Answered by Core.Restored.
type Restore struct {
	Shards     []int
	Generation int64
}

// Rollback restores every shard, in Generation, after the model
// diverged: from the newest valid checkpoint at or before step AtMost
// (the initial weights if there is none), with the learning rate scaled
// by LRFactor (the core's LRFactor, which Init sends). The checkpoints of
// later steps are first moved aside: they may hold the diverged model.
// Answered by Core.RolledBack.
type Rollback struct {
	AtMost     int64
	Generation int64
	LRFactor   float64
}

// SetMembership tells every shard which workers are alive (a sync step
// waits only for those) and, in an elastic run (docs/elastic.md; Members
// > 0), the whole membership: the workers that contribute, the removed
// ones, the replicas to aggregate, the last step and a hold at a step
// boundary (HoldAt > 0). Answered by Core.MembershipSent, or
// Core.MembershipRefused when a shard refused the hold.
type SetMembership struct {
	Live       []int32
	Members    int
	Retired    []int32
	Replicas   int
	MaxVersion int64
	HoldAt     int64
	// Quarantined are the quarantined workers (docs/security.md,
	// "Attribution"): never in Live; their pushes are refused and their
	// pulls answer done.
	Quarantined []int32
}

func (a SetMembership) equal(b SetMembership) bool {
	return slices.Equal(a.Live, b.Live) && a.Members == b.Members && slices.Equal(a.Retired, b.Retired) &&
		a.Replicas == b.Replicas && a.MaxVersion == b.MaxVersion && a.HoldAt == b.HoldAt &&
		slices.Equal(a.Quarantined, b.Quarantined)
}

// Evaluate pulls the model from every shard, each keeping the version it
// sends (PullRequest.retain), and scores it: first on the test subset;
// then on the whole test set if that first pass scored at least
// ConfirmAbove (0: always the whole set). Answered by Core.Evaluated.
type Evaluate struct {
	Seq          int64
	Generation   int64
	Subset       float64 // the fraction of the test set the first pass scores
	ConfirmAbove float64
	// Retain has each shard keep the state it sends (a target stop hands
	// back the model of the evaluation that completed the hold); without,
	// a shard drops what it kept before (docs/recovery.md, "Retained
	// evaluation snapshots").
	Retain bool
}

// Checkpoint writes a checkpoint: each shard its slice, then the
// manifest. Versions are the shards' versions at the last poll (a sync
// checkpoint is taken a few versions past them); Retained writes the
// state each shard kept at the last evaluation (the model handed back by
// a target stop, or the best model so far with --patience) instead of
// the live state. Answered by Core.CheckpointDone.
type Checkpoint struct {
	Versions []int64
	Latest   int64 // the newest committed checkpoint's step (-1: none)
	Final    bool
	Retained bool
	// Step names a Retained checkpoint that is not Final: the step of the
	// evaluation whose state the shards retained.
	Step int64
	// Stopped says Versions are every shard's version after the stop (all
	// answered it), not an older poll's: only then may a final checkpoint
	// reuse a committed one that holds those versions.
	Stopped bool
	// KeepGood is the newest step a rollback may go back to
	// (Core.rollbackBound): the newest valid checkpoint at or before it
	// is kept beyond the store's retention (-1: none to keep).
	KeepGood int64
}

// Reinit initialises every shard, in Generation, with the model the
// chief scored last (it holds those parameters) at Version, and stops
// them again: the fallback when a shard lost the state it retained for a
// target stop (it was restarted). The optimizer state starts afresh.
// Answered by Core.Reinitialised.
type Reinit struct {
	Generation, Version int64
}

// StopShards tells every shard training is over (workers see it on
// their next pull). Answered by Core.ShardsStopped.
type StopShards struct{}

// Promote makes Task (standby/N or ps/N), the standby of shard Shard,
// the shard's primary at Epoch: its primary died with the standby
// attached (docs/replication.md, rule 1). Answered by Core.Promoted with
// the version the new primary serves from, or Core.PromoteFailed.
type Promote struct {
	Shard int
	Task  string
	Epoch int64
}

// SetStandby tells shard Shard's primary where its standby listens, at
// Epoch: Addr "" drops the standby (it died: the primary goes on alone),
// else the primary sends that process a snapshot and then every update
// (docs/replication.md, rules 2 and 3). Answered by Core.StandbySet or
// Core.StandbyFailed.
type SetStandby struct {
	Shard int
	Epoch int64
	Addr  string
}

// SaveState persists what a restarted chief needs.
type SaveState struct{ State State }

// ErrGaveUp is matched by the error of a run the chief ended on purpose
// (Finish with Err: the tasks never registered, the model kept
// diverging): a restarted chief would not do better.
var ErrGaveUp = errors.New("chief: gave up")

// gaveUp is a Finish's error: its message, matching ErrGaveUp.
type gaveUp struct{ error }

func (g gaveUp) Is(target error) bool { return target == ErrGaveUp }
func (g gaveUp) Unwrap() error        { return g.error }

// Finish ends the run: Report is the result (nil with Err).
type Finish struct {
	Report *report.Report
	Err    error
}

func (InitCluster) action()   {}
func (Restore) action()       {}
func (Rollback) action()      {}
func (SetMembership) action() {}
func (Evaluate) action()      {}
func (Checkpoint) action()    {}
func (Reinit) action()        {}
func (StopShards) action()    {}
func (Promote) action()       {}
func (SetStandby) action()    {}
func (SaveState) action()     {}
func (Finish) action()        {}

func (a InitCluster) String() string {
	return fmt.Sprintf("init-cluster generation=%d resume=%t", a.Generation, a.Resume)
}
func (a Restore) String() string {
	return fmt.Sprintf("restore shards=%s generation=%d", ints(a.Shards), a.Generation)
}
func (a Rollback) String() string {
	return fmt.Sprintf("rollback at-most-step=%d generation=%d lr-factor=%g", a.AtMost, a.Generation, a.LRFactor)
}
func (a SetMembership) String() string {
	s := "set-membership live=" + ints(a.Live)
	if a.Members > 0 {
		s += fmt.Sprintf(" members=%d retired=%s replicas=%d max-version=%d hold-at=%d", a.Members, ints(a.Retired), a.Replicas, a.MaxVersion, a.HoldAt)
	}
	if len(a.Quarantined) > 0 {
		s += " quarantined=" + ints(a.Quarantined)
	}
	return s
}
func (a Evaluate) String() string {
	s := fmt.Sprintf("evaluate seq=%d generation=%d subset=%g confirm-above=%g", a.Seq, a.Generation, a.Subset, a.ConfirmAbove)
	if a.Retain {
		s += " retain"
	}
	return s
}
func (a Checkpoint) String() string {
	s := fmt.Sprintf("checkpoint versions=%s latest=%d final=%t retained=%t stopped=%t", ints(a.Versions), a.Latest, a.Final, a.Retained, a.Stopped)
	if a.Retained && !a.Final {
		s += fmt.Sprintf(" step=%d keep-good=%d", a.Step, a.KeepGood)
	}
	return s
}
func (a Reinit) String() string {
	return fmt.Sprintf("reinit-from-evaluated generation=%d version=%d", a.Generation, a.Version)
}
func (StopShards) String() string { return "stop-shards" }
func (a Promote) String() string {
	return fmt.Sprintf("promote shard=%d task=%s epoch=%d", a.Shard, a.Task, a.Epoch)
}
func (a SetStandby) String() string {
	addr := a.Addr
	if addr == "" {
		addr = "none"
	}
	return fmt.Sprintf("set-standby shard=%d epoch=%d addr=%s", a.Shard, a.Epoch, addr)
}
func (a SaveState) String() string {
	return fmt.Sprintf("save-state generation=%d", a.State.Generation)
}
func (a Finish) String() string {
	if a.Err != nil {
		return "finish error=" + a.Err.Error()
	}
	r := a.Report
	acc := "none"
	if len(r.Evals) > 0 {
		acc = fmt.Sprintf("%.4f", r.TestAccuracy)
	}
	final := ""
	if r.Checkpoints.FinalFailed {
		final = " final-checkpoint-failed"
	}
	s := fmt.Sprintf("finish stopped-by=%s global-steps=%d final-step=%d test-accuracy=%s checkpoints=%d/%d-failed%s",
		r.StoppedBy, r.GlobalSteps, r.FinalStep, acc, r.Checkpoints.Committed, r.Checkpoints.Failed, final)
	if len(r.Divergences) > 0 {
		s += fmt.Sprintf(" divergences=%d", len(r.Divergences))
	}
	if len(r.Quarantined) > 0 {
		s += " quarantined=" + strings.Join(r.Quarantined, ",")
	}
	if r.Ruined != "" {
		s += fmt.Sprintf(" ruined=%q", r.Ruined)
	}
	return s
}

func ints[T int | int32 | int64](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ",") + "]"
}
