package chief

import (
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/metrics"
)

func TestDivergedRule(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, c := range []struct {
		loss, best float64
		ok, want   bool
	}{
		{nan, 0, false, true},  // not finite: always
		{inf, 0.1, true, true}, // ...
		{-inf, 0.1, true, true},
		{1e30, 0, false, false},  // no best yet: only a non-finite loss
		{1.09, 0.1, true, false}, // best + 1 is the bound when 4 x best is lower
		{1.11, 0.1, true, true},
		{1.99, 0.5, true, false}, // 4 x best is the bound above that
		{2.01, 0.5, true, true},
		// The worst honest ratios measured (docs/security.md): 1.98 x the
		// best, or the best + 0.79.
		{1.98 * 0.36, 0.36, true, false},
		{1.75, 0.96, true, false},
	} {
		if got := Diverged(c.loss, c.best, c.ok); got != c.want {
			t.Errorf("Diverged(%v, %v, %t) = %t, want %t", c.loss, c.best, c.ok, got, c.want)
		}
	}
}

// trainingCore is a core of 2 PS and 2 workers whose training started at
// step 0, and the time.
func trainingCore(t *testing.T, m *metrics.Chief) (*Core, time.Time) {
	t.Helper()
	r := config.Default()
	r.HeartbeatTimeout = time.Minute
	now := time.Unix(1_000_000, 0)
	c := NewCore(CoreParams{Run: r, TrainN: 60000, Model: "test", Evaluate: true, Checkpoints: true,
		StartupTimeout: time.Minute, EvalSubset: 0.2}, "run-test", slog.New(slog.NewTextHandler(io.Discard, nil)), m, now)
	for _, reg := range []Registration{{Role: "ps", Index: 0}, {Role: "ps", Index: 1}, {Role: "worker", Index: 0}, {Role: "worker", Index: 1}} {
		reg.Settings = r.Settings()
		if _, err := c.Register(reg, now); err != nil {
			t.Fatal(err)
		}
	}
	c.Tick(now, nil, nil)
	c.Started(now, 0, -1)
	return c, now
}

func actionOf[T Action](acts []Action) (T, bool) {
	for _, a := range acts {
		if x, ok := a.(T); ok {
			return x, true
		}
	}
	var zero T
	return zero, false
}

// Each divergence halves the learning rate and rolls back; past
// MaxRollbacks the run stops, failed, says so, and hands back the best
// model there was. The saved state
// and the report encode as JSON although a loss was NaN.
func TestRollbacksHalveTheRateThenGiveUp(t *testing.T) {
	m := metrics.NewChief(prometheus.NewRegistry())
	c, now := trainingCore(t, m)
	seq := int64(0)
	eval := func(step int64, loss float64) []Action {
		seq++
		now = now.Add(time.Second)
		return c.Evaluated(now, EvalResult{Seq: seq, Generation: c.Generation(), Step: step, At: now, Loss: loss, Accuracy: 0.5})
	}
	eval(10, 0.3)
	for i := 1; i <= MaxRollbacks; i++ {
		acts := eval(20, math.NaN())
		rb, ok := actionOf[Rollback](acts)
		if !ok || rb.Generation != c.Generation() || rb.LRFactor != math.Pow(0.5, float64(i)) || c.LRFactor() != rb.LRFactor {
			t.Fatalf("divergence %d: %v (lr factor %v)", i, acts, c.LRFactor())
		}
		if st, ok := actionOf[SaveState](acts); !ok || len(st.State.Divergences) != i {
			t.Fatalf("divergence %d: the saved state has %+v", i, st.State.Divergences)
		} else if _, err := json.Marshal(st.State); err != nil {
			t.Fatalf("the saved state does not encode: %v", err)
		}
		c.RolledBack(now, 0, false)
	}
	acts := eval(20, math.Inf(1))
	if _, ok := actionOf[StopShards](acts); !ok || c.stopReason != StopFailed || !strings.Contains(c.st.GaveUp, "diverged 6 times") {
		t.Fatalf("divergence %d: %v, gave up %q: want the run stopped, failed", MaxRollbacks+1, acts, c.st.GaveUp)
	}
	// The stop hands back the best model there was: here the initial
	// weights (every model since diverged).
	ev, ok := actionOf[Evaluate](c.ShardsStopped(now, []int64{20, 20}))
	if !ok {
		t.Fatal("no final evaluation")
	}
	hb, ok := actionOf[HandBack](c.Evaluated(now, EvalResult{Seq: ev.Seq, Generation: ev.Generation, Step: 20, At: now, Loss: math.NaN(), Full: true}))
	if !ok {
		t.Fatal("the diverged model is not replaced")
	}
	ev, _ = actionOf[Evaluate](c.HandedBack(now, HandBackResult{Step: 0, Versions: []int64{0, 0}}))
	ck, ok := actionOf[Checkpoint](c.Evaluated(now, EvalResult{Seq: ev.Seq, Generation: hb.Generation, Step: 0, At: now, Loss: 2.3, Accuracy: 0.1, Full: true}))
	if !ok {
		t.Fatal("no final checkpoint of the model handed back")
	}
	f, ok := actionOf[Finish](c.CheckpointDone(now, CheckpointResult{Final: true, Step: ck.Latest + 1}))
	if !ok || f.Err != nil || f.Report.StoppedBy != StopFailed || !strings.Contains(f.Report.Ruined, "diverged 6 times") ||
		!strings.Contains(f.Report.Ruined, "handed back the initial model") || f.Report.FinalStep != 0 {
		t.Fatalf("the failed run's end: %v", f)
	}
	// MaxRollbacks+1 during training, and the final evaluation's.
	if got := testutil.ToFloat64(m.Divergences); got != MaxRollbacks+2 {
		t.Errorf("pstrain_divergences_total = %v, want %d", got, MaxRollbacks+2)
	}
	if _, err := json.Marshal(c.report()); err != nil {
		t.Errorf("the report does not encode: %v", err)
	}
}

// A divergence found by the final evaluation is reported, not rolled
// back, and the stop goes on: the diverged model is not the one handed
// back (an earlier one is restored, scored and checkpointed).
func TestDivergenceAtTheEndIsReported(t *testing.T) {
	c, now := trainingCore(t, nil)
	c.Evaluated(now, EvalResult{Seq: 1, Generation: 1, Step: 10, At: now, Loss: 0.2})
	c.Interrupt(now)
	acts := c.ShardsStopped(now, []int64{30, 30})
	ev, ok := actionOf[Evaluate](acts)
	if !ok {
		t.Fatalf("no final evaluation: %v", acts)
	}
	acts = c.Evaluated(now, EvalResult{Seq: ev.Seq, Generation: 1, Step: 30, At: now, Loss: 50, Full: true})
	if _, ok := actionOf[Rollback](acts); ok {
		t.Fatalf("rolled back after training ended: %v", acts)
	}
	hb, ok := actionOf[HandBack](acts)
	if !ok || hb.AtMost != 10 {
		t.Fatalf("the stop did not go on to hand back the model of step 10 or before: %v", acts)
	}
	acts = c.HandedBack(now, HandBackResult{Step: 10, FromCheckpoint: true, Versions: []int64{10, 10}})
	ev, ok = actionOf[Evaluate](acts)
	if !ok || ev.Generation != hb.Generation {
		t.Fatalf("the model handed back is not scored: %v", acts)
	}
	acts = c.Evaluated(now, EvalResult{Seq: ev.Seq, Generation: ev.Generation, Step: 10, At: now, Loss: 0.2, Accuracy: 0.9, Full: true})
	if ck, ok := actionOf[Checkpoint](acts); !ok || !ck.Final || ck.Latest != 10 || ck.Versions[0] != 10 {
		t.Errorf("the stop did not go on to the final checkpoint of the model handed back: %v", acts)
	}
	rep := c.report()
	if len(rep.Divergences) != 1 || rep.Divergences[0].RolledBackTo != -1 || rep.Divergences[0].AtStep != 30 {
		t.Errorf("divergences %+v", rep.Divergences)
	}
	if rep.FinalStep != 10 || rep.TestAccuracy != 0.9 || rep.HandedBack == nil || rep.HandedBack.RuinedStep != 30 || !strings.Contains(rep.Ruined, "handed back the model of step 10") {
		t.Errorf("final step %d, accuracy %v, handed back %+v, ruined %q: want the model of step 10 handed back in place of step 30's",
			rep.FinalStep, rep.TestAccuracy, rep.HandedBack, rep.Ruined)
	}
}

// The rollback's file work: the checkpoints after the last good step are
// moved aside (not deleted), and the shards are initialised with the
// learning-rate factor the core holds.
func TestRollbackSetsAsideLaterCheckpointsAndScalesTheRate(t *testing.T) {
	dir := t.TempDir()
	store := checkpoint.NewStore(checkpoint.OSFS{}, dir, 0)
	for _, step := range []int64{10, 20, 30, 40} {
		info, err := store.WriteShard(step, 0, 1, []checkpoint.Tensor{{Name: "w", Shape: []int{1}, Data: []float32{float32(step)}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Commit(checkpoint.Manifest{Step: step, Version: step, Shards: []checkpoint.ShardInfo{info}}); err != nil {
			t.Fatal(err)
		}
	}
	r := config.Default()
	c, err := New(Config{Run: r, Spec: r.Spec(784, 10), RunID: "run-1", PS: make([]PS, r.PS), Store: store,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.setAsideAfter(20); err != nil {
		t.Fatal(err)
	}
	infos, err := store.List()
	if err != nil || len(infos) != 2 || infos[0].Step != 20 {
		t.Fatalf("after setting aside: %+v, %v; want steps 20 and 10", infos, err)
	}
	moved, _ := filepath.Glob(filepath.Join(dir, "diverged-*", "*"))
	if len(moved) != 2 {
		t.Errorf("moved aside: %v, want the checkpoints of steps 30 and 40", moved)
	}

	if o := c.shardOptions(); o.LRFactor != 0 || o.Rate() != r.LR {
		t.Errorf("before any rollback: factor %v, rate %v", o.LRFactor, o.Rate())
	}
	c.core.st.LRFactor = 0.25
	if o := c.shardOptions(); o.LRFactor != 0.25 || o.Rate() != r.LR/4 {
		t.Errorf("after two rollbacks: factor %v, rate %v; want 0.25 and %v", o.LRFactor, o.Rate(), r.LR/4)
	}
}

// A chief restarted while it was handing back an earlier model finishes
// the hand-back: the saved state says one began, the stop resumes, and
// the model the shards hold is scored and, still ruined, replaced.
func TestHandBackSurvivesAChiefRestart(t *testing.T) {
	c, now := trainingCore(t, nil)
	c.Evaluated(now, EvalResult{Seq: 1, Generation: 1, Step: 10, At: now, Loss: 0.2})
	c.Interrupt(now)
	ev, _ := actionOf[Evaluate](c.ShardsStopped(now, []int64{30, 30}))
	acts := c.Evaluated(now, EvalResult{Seq: ev.Seq, Generation: 1, Step: 30, At: now, Loss: math.NaN(), Full: true})
	hb, ok := actionOf[HandBack](acts)
	if !ok {
		t.Fatalf("no hand-back: %v", acts)
	}
	var saved State
	for _, a := range acts {
		if s, ok := a.(SaveState); ok {
			b, err := json.Marshal(s.State)
			if err != nil {
				t.Fatal(err)
			}
			saved = State{}
			if err := json.Unmarshal(b, &saved); err != nil {
				t.Fatal(err)
			}
		}
	}
	if saved.HandedBack == nil || saved.Generation != hb.Generation {
		t.Fatalf("the saved state does not hold the hand-back: %+v", saved)
	}

	c2, now := trainingCore(t, nil)
	if _, ok := actionOf[StopShards](c2.Adopt(now, Adoption{Generation: hb.Generation, Step: 30, Saved: &saved})); !ok {
		t.Fatal("the restarted chief does not finish the stop")
	}
	ev, ok = actionOf[Evaluate](c2.ShardsStopped(now, []int64{30, 30}))
	if !ok {
		t.Fatal("the restarted chief does not score the model")
	}
	acts = c2.Evaluated(now, EvalResult{Seq: ev.Seq, Generation: ev.Generation, Step: 30, At: now, Loss: math.NaN(), Full: true})
	if again, ok := actionOf[HandBack](acts); !ok || again.Generation <= hb.Generation {
		t.Fatalf("the restarted chief hands back the ruined model: %v", acts)
	}
}
