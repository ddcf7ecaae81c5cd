package chief

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/pstrain/pstrain/ml/model"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/scenariotest"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
)

// TestScenarios replays testdata/*.txt against the Core
// (internal/scenariotest; -rewrite rewrites the expected output: read the
// diff before committing it). After "----" a block shows the actions (or
// answer) the core must give. The events:
//
//	config KEY=VALUE...          a new core (ps, workers, mode, model, target, hold, patience,
//	                             epochs, batch, train-n, eval-every, subset,
//	                             checkpoint-every, heartbeat, resume,
//	                             replicas-to-aggregate, max-workers,
//	                             split (--data-split),
//	                             evaluate, checkpoints, standbys: true
//	                             gives every shard a hot standby)
//	register ROLE INDEX [lr=F] t=S  a task registers (lr: with another
//	                             learning rate than the run's)
//	heartbeat WORKER t=S          a worker's heartbeat
//	tick t=S [shards=V,V,...]     a poll; V is a version, "down" (no answer),
//	     [done=I,...]             "empty" (back without state); done lists
//	     [refused=W:N,...]        shards that say training is done; every
//	     [non-finite=W:N,...]     shard says its norm guard refused N of
//	     [outlier=W]              worker W's gradients since its Init (N
//	                             non-finite ones), and that its first
//	                             out-of-line gradient was worker W's.
//	     [standbys=V,...]         With hot standbys, shards are the ps/N
//	                             processes, standbys the standby/N ones;
//	                             V may be V:ROLE[:EPOCH[:attached]]
//	                             (ROLE primary, standby or deposed;
//	                             attached, attaching or stuck: a primary
//	                             whose standby is the shard's other
//	                             process; stuck: an update of it has
//	                             waited 15 s for the standby)
//	     [gaps=W/F/T+W/F/T,...]   by shard, the runs of batches it skipped
//	                             (worker W's F..T-1)
//	     [gen=G,...]              by shard, its generation
//	started|restored t=S step=N [latest=N]
//	membership-sent live=I,...
//	evaluated t=S seq=N gen=N step=N acc=F [loss=F] [full] [err=MSG]
//	          [samples=N]         the test samples scored (default 2000,
//	                             full 10000)
//	rolled-back t=S step=N        the Rollback is done (step 0: the
//	                             initial weights, no checkpoint)
//	divergences                  the divergences recorded, the learning
//	                             rate's factor and the refused gradients
//	checkpoint-done t=S step=N [err=MSG] [skipped=MSG] [final] [retained]
//	                             [reused] (the newest checkpoint marked final)
//	                             [positions=P/P...] (the data positions it holds)
//	ledger                       the report's data ledger
//	handed-back t=S step=N [versions=V,...] [err=MSG]
//	                             the HandBack is done (step 0: the
//	                             initial weights), the shards stopped at
//	                             versions (err=nothing-restored: ErrNothingRestored)
//	reinitialised t=S
//	stopped t=S versions=V,...
//	interrupt t=S
//	adopt t=S gen=N step=N [split] [stopped-by=WHY [final-step=N final-acc=F]]
//	                             a restarted chief; stopped-by: the saved
//	                             state says a stop had begun
//	restart-chief t=S gen=N step=N [committed=N,...]  a restarted chief
//	                             adopts shards at generation N and step N
//	                             with the state the core last saved (a
//	                             SaveState action); committed: the steps of
//	                             the store's checkpoints (default none)
//	adopt t=S shards=V,... standbys=V,... [saved=TYPE:EPOCH,...]
//	                             a restarted chief finds these processes
//	                             (adoptionOf); its saved state holds
//	                             those primaries
//	promoted t=S shard=N version=V  the Promote is done
//	promote-failed t=S shard=N err=MSG
//	standby-set t=S shard=N epoch=E addr=A  the SetStandby is done
//	                             (addr=none: "")
//	standby-failed t=S shard=N err=MSG
//	replicas                     each shard's primary and epoch
//	restarts                     the restarts recorded
//	live-workers                 the changes of the number of workers
//	                             training the report records
//	checkpoint-at versions=V,... latest=N ahead=N [final]
//	                             where a checkpoint goes (checkpointAt)
//	scale N t=S                  ask for N workers (Core.Scale)
//	heartbeat W t=S eras=N        (with eras: the worker uses a data plan
//	                             of N eras; prints the plan it is sent)
//	  [pos=P hold=H waiting]     (what it reads: the next batch's
//	                             position, its plan's hold, waiting for
//	                             the chief; with a data queue the core
//	                             may hand it chunks: "(saved)")
//	  [leases=N]                 (the queue's chunks its plan has)
//	membership-refused t=S       a shard refused the hold
//	plan                         workers, target, last step, data plan
//	                             (eras epoch@step:workers, /batches per
//	                             epoch), the changes recorded
//	state                        the core's phase, generation, hold, step
//
// Times are seconds since the core was made.
func TestScenarios(t *testing.T) {
	scenariotest.Run(t, 8, func() scenariotest.Directive {
		s := &scenario{t0: time.Unix(1_000_000, 0)}
		return func(d *datadriven.TestData) (string, error) { return s.do(d.FullCmd()) }
	})
}

type scenario struct {
	t0     time.Time
	core   *Core
	params CoreParams // the core's, for a restarted one
	saved  *State     // the state of the last SaveState action
}

func nums(s string) []int64 {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.ParseInt(f, 10, 64); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func (s *scenario) do(cmd string) (string, error) {
	f := strings.Fields(cmd)
	a := scenariotest.Fields(f[1:])
	switch {
	case f[0] == "config":
		return "", s.config(a)
	case s.core == nil:
		return "", errors.New("no config yet")
	case f[0] == "register" || f[0] == "heartbeat":
		return s.member(f, a), nil
	case strings.HasPrefix(f[0], "ps-"):
		return s.psCommand(f, a) // psscale_scenario_test.go
	case f[0] == "checkpoint-at":
		_, final := a["final"]
		step, at, skip := checkpointAt(s.core.p.Run.Mode, s.core.MaxSteps(),
			Checkpoint{Latest: a.Num("latest"), Final: final}, nums(a["versions"]), a.Num("ahead"))
		return fmt.Sprintf("step=%d at-version=%d skip=%q", step, at, skip), nil
	case f[0] == "divergences":
		return s.divergences(), nil
	case f[0] == "suspects":
		return s.suspects(), nil
	case f[0] == "scale":
		n, _ := strconv.Atoi(f[1])
		if err := s.core.Scale(n, a.At(s.t0)); err != nil {
			return "error: " + err.Error(), nil
		}
		return "ok", nil
	case f[0] == "plan":
		c := s.core
		return fmt.Sprintf("workers=%d target=%d max-steps=%d plan=%s changes=%+v", c.workers(), c.Target(), c.MaxSteps(),
			planText(c.Plan()), c.st.Membership), nil
	case f[0] == "replicas":
		var lines []string
		for i := range s.core.st.Replicas {
			r := s.core.Replica(i)
			lines = append(lines, fmt.Sprintf("shard=%d primary=%s/%d epoch=%d", i, r.Primary, i, r.Epoch))
		}
		return strings.Join(lines, "\n"), nil
	case f[0] == "restarts":
		return s.restarts(), nil
	case f[0] == "ledger":
		return fmt.Sprintf("%+v", s.core.report().DataLedger), nil
	case f[0] == "live-workers":
		return fmt.Sprintf("%+v", s.core.report().LiveWorkers), nil
	case f[0] == "restart-chief":
		return s.restartChief(a)
	case f[0] == "state":
		c := s.core
		return fmt.Sprintf("phase=%s generation=%d hold=%d step=%d latest-checkpoint=%d restarts=%d",
			c.Phase(), c.Generation(), c.hold, c.step, c.LatestCheckpoint(), len(c.st.Restarts)), nil
	}
	event, ok := s.events()[f[0]]
	if !ok {
		return "", fmt.Errorf("unknown event %q", f[0])
	}
	return s.actions(event(a, a.At(s.t0))), nil
}

// actions prints acts, one a line, and keeps the state the last
// SaveState among them saves (as it would be read back).
func (s *scenario) actions(acts []Action) string {
	var lines []string
	for _, x := range acts {
		lines = append(lines, x.String())
		if st, ok := x.(SaveState); ok {
			b, err := json.Marshal(st.State)
			if err != nil {
				panic(err)
			}
			s.saved = &State{}
			if err := json.Unmarshal(b, s.saved); err != nil {
				panic(err)
			}
		}
	}
	if len(lines) == 0 {
		return "(nothing)"
	}
	return strings.Join(lines, "\n")
}

// restartChief replaces the core by a new one of the same parameters
// that adopts the shards with the last saved state.
func (s *scenario) restartChief(a scenariotest.Args) (string, error) {
	if s.saved == nil {
		return "", errors.New("restart-chief: no state saved yet")
	}
	now := a.At(s.t0)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s.core = NewCore(s.params, "run-test", log, metrics.NewChief(prometheus.NewRegistry()), now)
	var committed []int64
	if _, ok := a["committed"]; ok {
		committed = nums(a["committed"])
	}
	return s.actions(s.core.Adopt(now, Adoption{Generation: a.Num("gen"), Step: a.Num("step"), Saved: s.saved, Committed: committed})), nil
}

// events are the script's events that return actions.
func (s *scenario) events() map[string]func(a scenariotest.Args, now time.Time) []Action {
	c := s.core
	return map[string]func(scenariotest.Args, time.Time) []Action{
		"tick": func(a scenariotest.Args, now time.Time) []Action {
			shards := shardsOf(a, "shards")
			if v, ok := a["gaps"]; ok {
				for i, f := range strings.Split(v, ",") {
					shards[i].Gaps = nums(strings.NewReplacer("/", ",", "+", ",").Replace(f))
				}
			}
			if v, ok := a["gen"]; ok {
				for i, g := range nums(v) {
					shards[i].Generation = g
				}
			}
			return c.Tick(now, shards, shardsOf(a, "standbys"))
		},
		"promoted": func(a scenariotest.Args, now time.Time) []Action {
			return c.Promoted(now, int(a.Num("shard")), a.Num("version"))
		},
		"promote-failed": func(a scenariotest.Args, now time.Time) []Action {
			return c.PromoteFailed(now, int(a.Num("shard")), errors.New(a["err"]))
		},
		"standby-set": func(a scenariotest.Args, now time.Time) []Action {
			addr := a["addr"]
			if addr == "none" {
				addr = ""
			}
			return c.StandbySet(now, int(a.Num("shard")), a.Num("epoch"), addr)
		},
		"standby-failed": func(a scenariotest.Args, now time.Time) []Action {
			return c.StandbyFailed(now, int(a.Num("shard")), errors.New(a["err"]))
		},
		"started": func(a scenariotest.Args, now time.Time) []Action {
			return c.Started(now, a.Num("step"), a.Num("latest"))
		},
		"restored": func(a scenariotest.Args, now time.Time) []Action { return c.Restored(now, a.Num("step")) },
		"rolled-back": func(a scenariotest.Args, now time.Time) []Action {
			return c.RolledBack(now, a.Num("step"), a.Num("step") > 0)
		},
		"handed-back": func(a scenariotest.Args, now time.Time) []Action {
			err := a.Err()
			if a["err"] == "nothing-restored" {
				err = ErrNothingRestored
			}
			return c.HandedBack(now, HandBackResult{Step: a.Num("step"), FromCheckpoint: a.Num("step") > 0, Versions: nums(a["versions"]), Err: err})
		},
		"reinitialised":      func(a scenariotest.Args, now time.Time) []Action { return c.Reinitialised(now) },
		"stopped":            func(a scenariotest.Args, now time.Time) []Action { return c.ShardsStopped(now, nums(a["versions"])) },
		"interrupt":          func(a scenariotest.Args, now time.Time) []Action { return c.Interrupt(now) },
		"membership-refused": func(a scenariotest.Args, now time.Time) []Action { return c.MembershipRefused(now) },
		"membership-sent": func(a scenariotest.Args, now time.Time) []Action {
			var live []int32
			for _, n := range nums(a["live"]) {
				live = append(live, int32(n))
			}
			c.MembershipSent(live)
			return nil
		},
		"evaluated": func(a scenariotest.Args, now time.Time) []Action {
			acc, _ := strconv.ParseFloat(a["acc"], 64)
			loss, _ := strconv.ParseFloat(a["loss"], 64) // "NaN" too
			_, full := a["full"]
			res := EvalResult{Seq: a.Num("seq"), Generation: a.Num("gen"), Step: a.Num("step"), At: now,
				Accuracy: acc, Loss: loss, Full: full, Samples: 2000}
			if full {
				res.Samples = 10000
			}
			if _, ok := a["samples"]; ok {
				res.Scored = int(a.Num("samples"))
				res.Samples = min(res.Samples, res.Scored)
			}
			if e, ok := a["err"]; ok {
				res.Err = errors.New(e)
			}
			if cs, ok := a["cos"]; ok {
				// Each worker's cosine with the model's descent over the
				// window the evaluation's pull closed.
				w := &Window{UpdateSq: 1}
				for _, f := range strings.Split(cs, ",") {
					x, _ := strconv.ParseFloat(f, 64)
					w.Dot, w.Sq = append(w.Dot, x), append(w.Sq, 1)
				}
				res.Window = w
			}
			return c.Evaluated(now, res)
		},
		"checkpoint-done": func(a scenariotest.Args, now time.Time) []Action {
			_, retained := a["retained"]
			_, final := a["final"]
			_, reused := a["reused"]
			res := CheckpointResult{Step: a.Num("step"), Skipped: a["skipped"], Retained: retained, Final: final, Reused: reused,
				Positions: nums(strings.ReplaceAll(a["positions"], "/", ","))}
			if e, ok := a["err"]; ok {
				res.Err = errors.New(e)
			}
			return c.CheckpointDone(now, res)
		},
		"adopt": func(a scenariotest.Args, now time.Time) []Action {
			if _, ok := a["shards"]; ok {
				return s.adoptFound(a, now)
			}
			_, split := a["split"]
			ad := Adoption{Generation: a.Num("gen"), Step: a.Num("step"), Split: split}
			if by, ok := a["stopped-by"]; ok {
				// The previous chief saved a stop it had begun.
				ad.Saved = &State{RunID: "run-test", Evals: []report.Eval{}, Restarts: []report.Restart{},
					LatestCheckpoint: -1, Generation: ad.Generation, StoppedBy: by, TrainSeconds: 9}
				if acc, err := strconv.ParseFloat(a["final-acc"], 64); err == nil {
					ad.Saved.FinalEval = &report.Eval{Step: a.Num("final-step"), TestAccuracy: acc}
					ad.Saved.Evals = append(ad.Saved.Evals, *ad.Saved.FinalEval)
				}
			}
			return c.Adopt(now, ad)
		},
	}
}

func (s *scenario) config(a scenariotest.Args) error {
	r := config.Default()
	r.HeartbeatTimeout = time.Minute // scenarios about liveness set it
	p := CoreParams{Run: r, TrainN: 60000, Model: "test", Evaluate: true, Checkpoints: true,
		StartupTimeout: time.Minute, EvalSubset: 0.2, Spec: model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}}
	standbys := false
	for k, v := range a {
		var err error
		switch k {
		case "ps":
			p.Run.PS, err = strconv.Atoi(v)
		case "workers":
			p.Run.Workers, err = strconv.Atoi(v)
		case "mode":
			p.Run.Mode = config.Mode(v)
		case "split":
			p.Run.DataSplit = config.DataSplit(v)
		case "model":
			p.Run.Model, p.Run.Conv = config.ModelKind(v), config.DefaultCNNConv
		case "target":
			p.Run.TargetAccuracy, err = strconv.ParseFloat(v, 64)
		case "hold":
			p.Run.TargetHold, err = strconv.Atoi(v)
		case "patience":
			p.Run.Patience, err = strconv.Atoi(v)
		case "epochs":
			p.Run.Epochs, err = strconv.ParseFloat(v, 64)
		case "batch":
			p.Run.Batch, err = strconv.Atoi(v)
		case "train-n":
			p.TrainN, err = strconv.Atoi(v)
		case "eval-every":
			p.Run.EvalEvery, err = time.ParseDuration(v)
		case "subset":
			p.EvalSubset, err = strconv.ParseFloat(v, 64)
		case "checkpoint-every":
			p.Run.CheckpointEvery, err = config.ParseEvery(v)
		case "heartbeat":
			p.Run.HeartbeatTimeout, err = time.ParseDuration(v)
		case "initial-loss":
			p.InitialLoss, err = strconv.ParseFloat(v, 64)
		case "resume":
			p.Run.Resume = v == "true"
		case "evaluate":
			p.Evaluate = v == "true"
		case "checkpoints":
			p.Checkpoints = v == "true"
		case "standbys":
			standbys = v == "true"
		case "max-workers":
			p.Run.MaxWorkers, err = strconv.Atoi(v)
		case "max-ps":
			p.Run.MaxPS, err = strconv.Atoi(v)
		case "replicas-to-aggregate":
			p.Run.ReplicasToAggregate, err = strconv.Atoi(v)
		default:
			return fmt.Errorf("unknown config key %q", k)
		}
		if err != nil {
			return fmt.Errorf("config %s=%s: %w", k, v, err)
		}
	}
	if err := p.Run.Validate(); err != nil {
		return err
	}
	for i := range p.Run.PSSlots() {
		if standbys { // (one per PS slot, as the cluster file lists them)
			p.PSAddrs = append(p.PSAddrs, fmt.Sprintf("ps%d:7000", i))
			p.StandbyAddrs = append(p.StandbyAddrs, fmt.Sprintf("standby%d:7000", i))
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s.core, s.params, s.saved = NewCore(p, "run-test", log, metrics.NewChief(prometheus.NewRegistry()), s.t0), p, nil
	return nil
}

func (s *scenario) member(f []string, a scenariotest.Args) string {
	if f[0] == "heartbeat" {
		idx, _ := strconv.Atoi(f[1])
		stop, err := s.core.Heartbeat(idx, a.At(s.t0))
		if err != nil {
			return "error: " + err.Error()
		}
		out := fmt.Sprintf("ok stop=%t", stop)
		if pos, ok := a["pos"]; ok {
			p, _ := strconv.ParseInt(pos, 10, 64)
			_, waiting := a["waiting"]
			s.core.DataRead(idx, p, a.Num("hold"), waiting, a.At(s.t0))
			if _, leased := s.core.LeaseData(idx); leased {
				out += " (saved)"
			}
		}
		if eras, ok := a["eras"]; ok {
			n, _ := strconv.Atoi(eras)
			if p, changed := s.core.HeartbeatPlan(idx, n, int(a.Num("leases"))); changed {
				out += " plan=" + planText(p)
			}
		}
		return out
	}
	// register ROLE INDEX [lr=F] t=S: lr gives the task another
	// learning rate than the run's.
	idx, _ := strconv.Atoi(f[2])
	theirs := s.core.p.Run
	if lr, ok := a["lr"]; ok {
		theirs.LR, _ = strconv.ParseFloat(lr, 64)
	}
	step, err := s.core.Register(Registration{Role: f[1], Index: idx, Settings: theirs.Settings()}, a.At(s.t0))
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("ok step=%d", step)
}

// restarts prints the restarts recorded.
func (s *scenario) restarts() string {
	var lines []string
	for _, r := range s.core.st.Restarts {
		back := "never"
		if r.BackAtSeconds != nil {
			back = fmt.Sprintf("%.2f", *r.BackAtSeconds)
		}
		lines = append(lines, fmt.Sprintf("restart task=%s killed-at=%.2f back-at=%s restored-step=%d steps-lost=%d took-over=%q failover-seconds=%.2f",
			r.Task, r.KilledAtSeconds, back, r.RestoredStep, r.StepsLost, r.TookOver, r.FailoverSeconds))
	}
	if len(lines) == 0 {
		return "(none)"
	}
	return strings.Join(lines, "\n")
}

// adoptFound is an adopt of the processes found (adoptionOf), the
// saved state holding saved=TYPE:EPOCH,... as the shards' primaries.
func (s *scenario) adoptFound(a scenariotest.Args, now time.Time) []Action {
	saved := &State{RunID: "run-test", Evals: []report.Eval{}, Restarts: []report.Restart{}, LatestCheckpoint: -1}
	for _, r := range strings.Split(a["saved"], ",") {
		typ, e, ok := strings.Cut(r, ":")
		if n, err := strconv.ParseInt(e, 10, 64); ok && err == nil {
			saved.Replicas = append(saved.Replicas, Replica{Primary: typ, Epoch: n})
		}
	}
	ad, ok := adoptionOf(shardsOf(a, "shards"), shardsOf(a, "standbys"), saved)
	if !ok {
		return nil
	}
	return s.core.Adopt(now, ad)
}

// shardsOf reads key=10,down,empty,10:standby:1:attached and done=0,1
// (and the guard's counts, the same for every process listed).
func shardsOf(a scenariotest.Args, key string) []ShardStatus {
	v, ok := a[key]
	if !ok {
		return nil
	}
	var out []ShardStatus
	for _, f := range strings.Split(v, ",") {
		switch f {
		case "down":
			out = append(out, ShardStatus{Err: errors.New("connection refused")})
		case "empty":
			out = append(out, ShardStatus{})
		default:
			parts := strings.Split(f, ":")
			n, _ := strconv.ParseInt(parts[0], 10, 64)
			x := ShardStatus{Serving: true, Version: n}
			if len(parts) > 1 {
				x.Role = parts[1]
			}
			if len(parts) > 2 {
				x.Epoch, _ = strconv.ParseInt(parts[2], 10, 64)
			}
			if len(parts) > 3 { // attached, attaching or stuck: its standby is the shard's other process
				x.StandbyAttached = parts[3] != "attaching"
				if parts[3] == "stuck" { // attached, but an update unacknowledged for 15 s
					x.ReplicationLagSeconds = 15
				}
				x.StandbyAddr = fmt.Sprintf("standby%d:7000", len(out))
				if key == "standbys" {
					x.StandbyAddr = fmt.Sprintf("ps%d:7000", len(out))
				}
			}
			out = append(out, x)
		}
	}
	for _, d := range nums(a["done"]) {
		if int(d) < len(out) {
			out[d].Done = true
		}
	}
	outlier := -1
	if w, ok := a["outlier"]; ok {
		outlier, _ = strconv.Atoi(w)
	}
	for i := range out {
		out[i].Outlier = outlier
		out[i].Refused = workerCounts(a["refused"])
		out[i].NonFinite = workerCounts(a["non-finite"])
	}
	return out
}

// workerCounts reads W:N,... into counts by worker index.
func workerCounts(v string) []int64 {
	var out []int64
	for _, wn := range strings.Split(v, ",") {
		w, n, ok := strings.Cut(wn, ":")
		wi, err1 := strconv.Atoi(w)
		ni, err2 := strconv.ParseInt(n, 10, 64)
		if !ok || err1 != nil || err2 != nil || wi < 0 {
			continue
		}
		for len(out) <= wi {
			out = append(out, 0)
		}
		out[wi] = ni
	}
	return out
}

// divergences prints the divergences recorded, the learning rate's
// factor and the refused gradients by worker.
func (s *scenario) divergences() string {
	c := s.core
	var lines []string
	for _, d := range c.st.Divergences {
		lines = append(lines, fmt.Sprintf("divergence at-step=%d test-loss=%.4g best-loss=%.4g rolled-back-to=%d lr-factor=%g suspect=%q evidence=%q",
			d.AtStep, d.TestLoss, d.BestLoss, d.RolledBackTo, d.LRFactor, d.SuspectWorker, d.Evidence))
	}
	return strings.Join(append(lines, fmt.Sprintf("lr-factor=%g refused=%v non-finite=%v", c.LRFactor(), c.refused(false),
		c.nonFiniteGrads.byWorker(c.p.Run.Workers, false))), "\n")
}

func (s *scenario) suspects() string {
	c := s.core
	var lines []string
	for _, x := range c.st.Suspects {
		lines = append(lines, fmt.Sprintf("suspect %s at-step=%d reason=%q", x.Worker, x.AtStep, x.Reason))
	}
	lines = append(lines, fmt.Sprintf("quarantined=%v ruined=%q", c.quarantinedNames(), c.ruined()))
	for w := range c.p.Run.Workers {
		if why := c.QuarantineReason(w); why != "" {
			lines = append(lines, fmt.Sprintf("heartbeat worker/%d: %s", w, why))
		}
	}
	return strings.Join(lines, "\n")
}

// planText is a data plan in a line: its eras as epoch@step:workers.
func planText(p dataset.DataPlan) string {
	var eras []string
	for _, e := range p.Eras {
		eras = append(eras, fmt.Sprintf("%d@%d:%d", e.Epoch, e.Step, e.Workers))
	}
	out := fmt.Sprintf("[%s]/%d", strings.Join(eras, " "), p.PerEpoch(len(p.Eras)-1))
	if p.Hold > 0 {
		out += fmt.Sprintf(" hold=%d", p.Hold)
	}
	if p.Queued() {
		var leases []string // worker: its runs of chunks, first-last
		for w, ls := range p.Leases {
			var runs []string
			for _, l := range ls {
				runs = append(runs, fmt.Sprintf("%d-%d", l.First, l.First+l.Count-1))
			}
			leases = append(leases, fmt.Sprintf("%d:%s", w, strings.Join(runs, ",")))
		}
		out = fmt.Sprintf("[%s] queue=%dx%d next=%d leases=[%s]", strings.Join(eras, " "), p.ChunksPerEpoch(), p.Chunk, p.NextChunk, strings.Join(leases, " "))
	}
	return out
}
