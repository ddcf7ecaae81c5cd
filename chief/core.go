package chief

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
)

// Core is the chief's decision-making, as a plain synchronous state
// machine in the manner of etcd's raft: observations come in through its
// methods (a registration, a heartbeat, a poll of the shards, the result
// of an evaluation or a checkpoint, an interrupt), each with the time, and
// the decisions go out as Actions for the caller to carry out (initialise
// or restore shards, tell them the live workers, evaluate, checkpoint,
// stop, save the state, finish). It does no I/O, starts no goroutine and
// reads no clock; Chief.Run is the thin loop that performs its actions
// and feeds it what happened. It is not safe for concurrent use.
//
// The phases: registering (waiting for every task), starting (the
// shards are being initialised), training, stopping (the shards are
// stopped, the final model is evaluated and checkpointed) and finished.
type Core struct {
	p   CoreParams
	log *slog.Logger
	m   *metrics.Chief

	phase   phase
	created time.Time
	st      State // what a restarted chief needs (saved on change)

	membershipState
	replicaState
	progressState
	upkeepState
	stopState
	divergenceState
	elasticState
	psScaleState
	wireState
}

// membershipState is who registered and which workers are alive.
type membershipState struct {
	lastNag    time.Time // last "still waiting" log
	members    *Membership
	psSeen     []bool
	workerSeen []bool
	// standbySeen says which standby/N registered (nil without hot
	// standbys).
	standbySeen []bool
	lastLive    []int32 // the live set the shards were last told
	loggedLive  []int32 // the live set last logged
}

// replicaState is what the core knows of each shard's processes: with
// hot standbys, both processes between polls (core_replica.go; nil
// without them); when each shard went down; the restore under way.
type replicaState struct {
	rep       []replicaRun
	down      []time.Time // when each shard was first seen down (zero: up)
	restoring *restoreInfo
}

// progressState is training's progress as the shards last said it.
type progressState struct {
	start    time.Time // training start
	step     int64     // the lowest shard version at the last poll
	versions []int64   // each shard's version at the last poll
	// versionsStopped says versions came from every shard after the stop.
	versionsStopped bool
	stale           int64   // stale gradients dropped, summed over shards
	print           []int64 // psPrint of the last poll (core_psscale_async.go)
	loss            float32
	doneAt          time.Time // when a shard first said training is done
}

// upkeepState is the evaluations and checkpoints during training.
type upkeepState struct {
	evalSeq  int64     // evaluations ordered so far
	evalBusy bool      // an evaluation is running
	lastEval time.Time // when the last one was ordered
	pace     evalPace  // with the target in sight (core_evalpace.go)
	hold     int       // consecutive full evaluations at or above the target
	ckptBusy bool
	lastCkpt time.Time
	// ckptFailedAt is when the last checkpoint attempt failed.
	ckptFailedAt time.Time
}

// stopState is the stop: why, when, and the model handed back.
type stopState struct {
	stopReason     string
	trainEnd       time.Time
	steps          int64        // global steps trained at the stop
	finalEval      *report.Eval // the evaluation of the model handed back
	finalEvalAsked bool
	finalCkptAsked bool
	reinitAsked    bool
	handBackBusy   bool // a HandBack is under way (core_handback.go)
}

// divergenceState is the divergence guard (core_diverge.go): the shards'
// counts of gradients refused by the norm guard and of non-finite ones,
// the first out-of-line gradient's worker each shard reported (-1:
// none), the step this generation began at and whether a rollback began
// it, its newest good evaluation's step (-1: none), and the rollback
// decided (sent: ordered).
type divergenceState struct {
	refusedGrads, nonFiniteGrads shardCounts
	outliers                     []int
	genStart                     int64
	genFromRollback              bool
	lastGood                     int64
	rollback                     *Rollback
	rollbackSent                 bool
	// genEvals is how many evaluations were recorded when this
	// generation began; winLoss the test loss at the start of the
	// attribution window under way (NaN: unknown), strikes each
	// worker's windows in a row that singled it out (core_suspect.go).
	genEvals int
	winLoss  float64
	strikes  []int
}

// elasticState is elastic workers (core_elastic.go): the worker count
// asked for and when, the change under way, the data plan's eras each
// worker said it uses (during a change), the removed workers, and
// whether the run's end before the next boundary was logged. pending is
// the last SetMembership ordered, lastSent the last every shard heard.
type elasticState struct {
	target      int
	targetAsked time.Time
	change      *change
	acks        map[int]int
	retired     map[int]bool
	endNoted    bool
	pending     *SetMembership
	lastSent    *SetMembership
	// retiredHeard is what the shards may retire when lastSent is not
	// known (see shardsRetire).
	retiredHeard []int32
	// ach is an async or ssp run's change under way, reads what each
	// worker's heartbeat said of its reading (core_elastic_async.go).
	ach   *asyncChange
	reads map[int]dataRead
	// leasedSeq is, by worker, the state that last handed it chunks of
	// the data queue (core_queue.go).
	leasedSeq map[int]int64
	// gapsSeen are, by shard, its generation and the gaps of it the data
	// ledger counted; ckptPos the data positions of the newest
	// checkpoints by step (core_ledger.go).
	gapsSeen [][2]int64
	ckptPos  map[int64][]int64
}

type phase int

const (
	registering phase = iota
	starting
	training
	stopping
	finished
)

func (p phase) String() string {
	return [...]string{"registering", "starting", "training", "stopping", "finished"}[p]
}

// CoreParams are the run's facts the core decides from.
type CoreParams struct {
	Run    config.Run
	TrainN int        // training samples (after --data-fraction)
	Model  string     // the model, as the report names it
	Spec   model.Spec // the model spec, which every task must match
	// PSAddrs name the PS slots' addresses (--max-ps) in messages
	// (optional without hot standbys).
	PSAddrs []string
	// StandbyAddrs are the addresses of the shards' hot standbys
	// (standby/N), one per PS slot, or none: no hot standbys
	// (docs/replication.md). With them PSAddrs must be set too: a
	// primary is told its standby's address.
	StandbyAddrs []string
	// Evaluate says an evaluator exists; Checkpoints that a store does.
	Evaluate, Checkpoints bool
	// StartupTimeout bounds the wait for every task to register.
	StartupTimeout time.Duration
	// InitialLoss is the test loss of the model training starts from
	// (0: unknown): the baseline divergence is judged against from the
	// first evaluation, and a final model above it is ruined.
	InitialLoss float64
	// EvalSubset is the part of the test set (a fraction in (0,1]) a
	// routine evaluation scores; the whole set is scored only when that
	// score would complete the target's hold (see evalDue and
	// docs/semantics.md, "Evaluation, and what it costs").
	EvalSubset float64
}

// State is what the chief keeps on disk so that a restarted chief can
// go on with the report: written after every evaluation, checkpoint and
// recovery.
type State struct {
	RunID               string             `json:"run_id"`
	TrainStartedUnix    float64            `json:"train_started_unix"`
	Evals               []report.Eval      `json:"evals"`
	Restarts            []report.Restart   `json:"restarts"`
	TimeToTargetSeconds *float64           `json:"time_to_target_seconds"`
	TestSeconds         float64            `json:"test_seconds"`
	Generation          int64              `json:"generation"`
	LatestCheckpoint    int64              `json:"latest_checkpoint"`
	Checkpoints         report.Checkpoints `json:"checkpoints"`
	// The stop, once it began: why, the steps and seconds trained, and the
	// evaluation of the model a target stop hands back. A chief
	// restarted during the stop finishes it from here.
	StoppedBy    string       `json:"stopped_by,omitempty"`
	StopSteps    int64        `json:"stop_steps,omitempty"` // global steps trained at the stop
	TrainSeconds float64      `json:"train_seconds,omitempty"`
	FinalEval    *report.Eval `json:"final_eval,omitempty"`
	// LRFactor scales the learning rate after rollbacks (0: 1), and
	// Divergences are the divergences so far (docs/security.md).
	LRFactor    float64             `json:"lr_factor,omitempty"`
	Divergences []report.Divergence `json:"divergences,omitempty"`
	// GaveUp says why the chief gave up on the model (it kept
	// diverging) and stopped the run ("": it did not).
	GaveUp string `json:"gave_up,omitempty"`
	// Suspects are the workers attribution named, Quarantined the ones
	// quarantined (core_suspect.go).
	Suspects    []report.Suspect `json:"suspects,omitempty"`
	Quarantined []int            `json:"quarantined,omitempty"`
	// HandedBack is the hand-back of an earlier model in place of a
	// ruined final one, once it began (core_handback.go).
	HandedBack *report.HandedBack `json:"handed_back,omitempty"`
	// LiveWorkers are the changes of the number of workers training
	// (Core.noteLive).
	LiveWorkers []report.LiveWorkers `json:"live_workers,omitempty"`
	// Elastic workers (docs/elastic.md): the data plan, the worker count
	// changes, and the run's last step once a change moved it (0: the
	// MaxSteps formula).
	Plan       dataset.DataPlan          `json:"data_plan"`
	Membership []report.MembershipChange `json:"membership_changes,omitempty"`
	MaxSteps   int64                     `json:"max_steps,omitempty"`
	// PS is the parameter server count once a change moved it (0: the
	// run's --ps; core_psscale.go).
	PS int `json:"ps,omitempty"`
	// PSWeights are the shard weights of a rebalanced layout (none: equal
	// shares; docs/elastic.md, "Rebalancing").
	PSWeights []int `json:"ps_weights,omitempty"`
	// GenStart and GenEvals are the step the current generation began at
	// and the evaluations recorded then (Core.beginGeneration), for a
	// restarted chief that adopts shards of that generation.
	GenStart int64 `json:"gen_start,omitempty"`
	GenEvals int   `json:"gen_evals,omitempty"`
	// Best is the checkpoint of the best model evaluated so far, with
	// --patience (nil: none; core_best.go).
	Best *BestModel `json:"best,omitempty"`
	// BestPending is the evaluation whose retained state a checkpoint
	// under way writes (nil: none): a chief restarted before that
	// checkpoint's outcome was saved takes it as the best if the store
	// lists a checkpoint of its step (Adoption.Committed).
	BestPending *report.Eval `json:"best_pending,omitempty"`
	// PSAsked is the layout asked for while a change to it is under way
	// (nil: none): a restarted chief takes the change up again.
	PSAsked *AskedLayout `json:"ps_asked,omitempty"`
	// PSSwitch is a change's switch under way (nil: none), saved before
	// its Inits: a chief restarted during it does it again.
	PSSwitch *SwitchRecord `json:"ps_switch,omitempty"`
	// Ledger is the data ledger (core_ledger.go).
	Ledger []report.LedgerEntry `json:"data_ledger,omitempty"`
	// Replicas are, by shard, which process is the primary and the
	// replication epoch (hot standbys, docs/replication.md; empty
	// without them).
	Replicas []Replica `json:"replicas,omitempty"`
	// Seq numbers the states the core hands out to be saved, in order
	// (not saved: a state of a higher number is newer).
	Seq int64 `json:"-"`
}

// NewCore returns a core waiting for registrations.
func NewCore(p CoreParams, runID string, log *slog.Logger, m *metrics.Chief, now time.Time) *Core {
	if m == nil {
		m = metrics.NewChief(nil)
	}
	if p.EvalSubset <= 0 || p.EvalSubset > 1 {
		p.EvalSubset = 1
	}
	r := p.Run
	c := &Core{p: p, log: log, m: m, created: now,
		membershipState: membershipState{lastNag: now, members: NewMembership(r.HeartbeatTimeout),
			psSeen: make([]bool, r.PS), workerSeen: make([]bool, r.WorkerSlots())},
		elasticState:  elasticState{target: r.Workers, retired: map[int]bool{}},
		psScaleState:  psScaleState{psCount: r.PS, psTarget: r.PS},
		progressState: progressState{versions: make([]int64, r.PS)},
		replicaState:  replicaState{down: make([]time.Time, r.PS)},
		st: State{RunID: runID, Evals: []report.Eval{}, Restarts: []report.Restart{}, LatestCheckpoint: -1,
			Plan: initialPlan(p)},
		divergenceState: divergenceState{outliers: make([]int, r.PS), lastGood: -1, strikes: make([]int, r.WorkerSlots()),
			refusedGrads: newShardCounts(r.PS, r.Workers), nonFiniteGrads: newShardCounts(r.PS, r.Workers)}}
	if len(p.StandbyAddrs) > 0 {
		c.standbySeen, c.rep = make([]bool, max(r.PSSlots(), len(p.StandbyAddrs))), make([]replicaRun, r.PS)
		c.st.Replicas = make([]Replica, r.PS)
		for s := range c.st.Replicas {
			c.st.Replicas[s] = Replica{Primary: cluster.PS, Epoch: 1}
		}
	}
	c.beginGeneration(0, false)
	m.PS.Set(float64(r.PS))
	return c
}

// SamplesPerStep is what one version of the model consumes: a sync step
// aggregates R gradients of a batch each, an async/ssp update is one
// gradient.
func SamplesPerStep(r config.Run) int {
	if r.Mode == config.Sync {
		return r.Batch * r.Replicas()
	}
	return r.Batch
}

// StepsPerEpoch is how many versions one pass over trainN samples takes.
func StepsPerEpoch(r config.Run, trainN int) float64 {
	return float64(max(1, trainN)) / float64(SamplesPerStep(r))
}

// MaxSteps is the version at which training ends.
func MaxSteps(r config.Run, trainN int) int64 {
	return max(1, int64(math.Ceil(r.Epochs*float64(trainN)/float64(SamplesPerStep(r)))))
}

// MaxSteps is this run's last version.
// A change of the worker count moves it (core_elastic.go).
func (c *Core) MaxSteps() int64 {
	if c.st.MaxSteps > 0 {
		return c.st.MaxSteps
	}
	return MaxSteps(c.p.Run, c.p.TrainN)
}

// Phase names the core's phase (for logs and tests).
func (c *Core) Phase() string { return c.phase.String() }

// Generation is the current generation of the shards' state.
func (c *Core) Generation() int64 { return c.st.Generation }

// LatestCheckpoint is the newest committed checkpoint's step (-1: none).
func (c *Core) LatestCheckpoint() int64 { return c.st.LatestCheckpoint }

// Stopping reports whether workers are to stop (heartbeat answer).
func (c *Core) Stopping() bool { return c.phase >= stopping }

// Errors the registration and heartbeat answers can carry; the gRPC
// layer maps them to status codes.
var (
	ErrBadTask  = errors.New("no such task in this run")
	ErrMismatch = errors.New("does not match the chief's run")
	// ErrNotYet refuses a registration the task should retry shortly.
	ErrNotYet = errors.New("not yet")
	// ErrQuarantined refuses a quarantined worker (docs/security.md).
	ErrQuarantined = errors.New("quarantined")
)

// Registration is what a task says of itself when it registers.
type Registration struct {
	Role  string // "ps", "standby" or "worker"
	Index int
	// Settings are its run configuration's values every task must share
	// (config.Run.Settings).
	Settings []config.Setting
	Spec     *model.Spec // its model spec (nil: not checked)
}

// Register checks a task's configuration against the run's, records the
// registration and returns the step a worker joins at.
func (c *Core) Register(reg Registration, now time.Time) (int64, error) {
	var problems []string
	if reg.Spec != nil && !reg.Spec.Equal(c.p.Spec) {
		problems = append(problems, fmt.Sprintf("model spec: %s (chief) vs %s (this task)", c.p.Spec.JSON(), reg.Spec.JSON()))
	}
	problems = append(problems, config.DiffSettings(c.p.Run.Settings(), reg.Settings)...)
	if len(problems) > 0 {
		return 0, fmt.Errorf("%s/%d %w: %s", reg.Role, reg.Index, ErrMismatch, strings.Join(problems, "; "))
	}
	role, index := reg.Role, reg.Index
	switch role {
	case "ps":
		if err := c.admitPS(index, now); err != nil {
			return 0, err
		}
	case cluster.Standby:
		if index < 0 || index >= len(c.standbySeen) {
			return 0, fmt.Errorf("%w: standby index %d out of range (the run has %d)", ErrBadTask, index, len(c.standbySeen))
		}
		if c.standbySeen[index] {
			c.noteBackDuringSwitch(task(cluster.Standby, index), index, now)
		}
		c.standbySeen[index] = true
	case "worker":
		if err := c.registerWorker(index, now); err != nil {
			return 0, err
		}
	default:
		return 0, fmt.Errorf("%w: unknown role %q", ErrBadTask, role)
	}
	return c.step, nil
}

// registerWorker admits worker index, unless quarantined; a worker that
// registers again during training was restarted, and is recorded so.
func (c *Core) registerWorker(index int, now time.Time) error {
	if err := c.admit(index, now); err != nil {
		return err
	}
	if why := c.QuarantineReason(index); why != "" {
		return fmt.Errorf("worker/%d %w: %s", index, ErrQuarantined, why)
	}
	if c.workerSeen[index] && c.phase >= training && !c.retired[index] {
		// Registering again: the worker was restarted. It resumes its
		// data shard where the shards say it was and joins at the
		// current step.
		task := fmt.Sprintf("worker/%d", index)
		c.st.Restarts = append(c.st.Restarts, report.Restart{Task: task,
			BackAtSeconds: ptr(c.seconds(now)), RestoredStep: c.step})
		c.m.TaskRestarts.WithLabelValues(task).Inc()
		c.log.Warn("worker restarted; it rejoins training", "task", task, "step", c.step)
	}
	c.workerSeen[index] = true
	c.members.Beat(index, now)
	return nil
}

// Heartbeat keeps a worker alive and says whether it should stop.
func (c *Core) Heartbeat(worker int, now time.Time) (stop bool, err error) {
	if worker < 0 || worker >= len(c.workerSeen) {
		return false, fmt.Errorf("%w: worker index %d out of range (the run has at most %d)", ErrBadTask, worker, len(c.workerSeen))
	}
	c.members.Beat(worker, now)
	return c.Stopping() || c.stopRetired(worker), nil
}

// Missing lists the tasks that have not registered.
func (c *Core) Missing() []string {
	var out []string
	for i, ok := range c.psSeen[:min(len(c.psSeen), c.psCount)] { // (not the PS slots past the count)
		switch {
		case ok:
		case i < len(c.p.PSAddrs):
			out = append(out, fmt.Sprintf("ps/%d (%s)", i, c.p.PSAddrs[i]))
		default:
			out = append(out, fmt.Sprintf("ps/%d", i))
		}
	}
	for i, ok := range c.standbySeen[:min(len(c.standbySeen), c.psCount)] { // (likewise)
		if !ok {
			out = append(out, fmt.Sprintf("standby/%d (%s)", i, c.p.StandbyAddrs[i]))
		}
	}
	for i, ok := range c.workerSeen[:c.p.Run.Workers] {
		if !ok {
			out = append(out, fmt.Sprintf("worker/%d", i))
		}
	}
	return out
}

// Live is the sorted set of workers heard from within the heartbeat
// timeout.
func (c *Core) Live(now time.Time) []int32 {
	var out []int32
	for _, w := range c.members.Live(now) {
		out = append(out, int32(w))
	}
	return out
}

func (c *Core) seconds(now time.Time) float64 {
	if c.start.IsZero() {
		return 0
	}
	return now.Sub(c.start).Seconds()
}

// save is the action that persists the state.
func (c *Core) save() Action {
	c.st.Seq++
	st := c.st
	st.Evals = slices.Clone(st.Evals)
	st.Restarts = slices.Clone(st.Restarts)
	st.Divergences = slices.Clone(st.Divergences)
	st.Suspects = slices.Clone(st.Suspects)
	st.Quarantined = slices.Clone(st.Quarantined)
	st.Membership = slices.Clone(st.Membership)
	st.Plan.Eras = slices.Clone(st.Plan.Eras)
	st.Replicas = slices.Clone(st.Replicas)
	if b := st.Best; b != nil {
		st.Best = ptr(*b)
	}
	if e := st.BestPending; e != nil {
		st.BestPending = ptr(*e)
	}
	return SaveState{State: st}
}

func ptr[T any](v T) *T { return &v }
