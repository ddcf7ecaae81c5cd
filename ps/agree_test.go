package ps

import (
	"math"
	"testing"

	"github.com/pstrain/pstrain/config"
)

// The window's figures, by hand: sgd with lr 1 and two workers, one of
// them pushing the honest gradient's opposite times 4. The model moves
// the attacker's way: its sum lines up with the descent (cosine 1), the
// honest worker's points against it (cosine -1). Which of the two is
// the attacker is the chief's to say, from whether that move made the
// model better or worse.
func TestAgreementFigures(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}, 2)
	for range 3 {
		v := s.Version()
		mustPush(t, s, 0, v, grad(1, 2))
		mustPush(t, s, 1, v, grad(-4, -8))
	}
	w := s.CloseWindow()
	// Each step: params -= mean = (-1.5, -3); three steps: params
	// (4.5, 9), a descent (mark - params) of (-4.5, -9): along the
	// attacker's gradients, against the honest worker's.
	if w.From != 0 || w.To != 3 {
		t.Errorf("window %d..%d, want 0..3", w.From, w.To)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %g, want %g", what, got, want)
		}
	}
	near("update_sq", w.UpdateSq, 4.5*4.5+81)
	near("dot[0]", w.Dot[0], -3*(4.5+18))
	near("dot[1]", w.Dot[1], 12*(4.5+18))
	near("sq[0]", w.Sq[0], 9*5)
	near("sq[1]", w.Sq[1], 144*5)
	near("cos[0]", w.Dot[0]/math.Sqrt(w.Sq[0]*w.UpdateSq), -1)
	near("cos[1]", w.Dot[1]/math.Sqrt(w.Sq[1]*w.UpdateSq), 1)
	// The next window starts where this one ended.
	next := s.CloseWindow()
	if next.From != 3 || next.UpdateSq != 0 || next.Sq[0] != 0 || next.Sq[1] != 0 {
		t.Errorf("an empty window: %+v", next)
	}
}

// Refused gradients are not in a worker's sum: they never moved the
// model.
func TestAgreementLeavesRefusedOut(t *testing.T) {
	s := syncShard(t, 2, 2, 1, 20, config.Mean)
	warm(t, s, 2, grad(1))
	s.CloseWindow()
	v := s.Version()
	mustPush(t, s, 0, v, grad(1))
	if r := mustPush(t, s, 1, v, grad(1e6)); r.Outcome != Refused {
		t.Fatalf("huge gradient: %+v, want refused", r)
	}
	w := s.CloseWindow()
	if w.Sq[1] != 0 || w.Sq[0] != 1 {
		t.Errorf("sums' squared norms %v, want [1 0]", w.Sq)
	}
}

// A quarantined worker's pushes are refused and never counted, a sync
// step no longer waits for it, and its pulls answer done; lifting the
// quarantine (the whole set is sent every time) lets it back.
func TestQuarantine(t *testing.T) {
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}, 1)
	if _, err := s.SetMembership(Membership{Live: []int{0, 1}, Quarantined: []int{1}}); err != nil {
		t.Fatal(err)
	}
	if r := mustPush(t, s, 1, 0, grad(5)); r.Outcome != Quarantined || r.Advanced {
		t.Fatalf("quarantined worker's push: %+v", r)
	}
	if !s.PullReady(1, 1) || !s.Retired(1) || !s.Quarantined(1) {
		t.Error("a quarantined worker's pull must answer done at once")
	}
	if r := mustPush(t, s, 0, 0, grad(2)); !r.Advanced {
		t.Fatalf("the honest worker's gradient must complete the step alone: %+v", r)
	}
	if got := s.Params()[0]; got != -2 {
		t.Errorf("param %g after the step, want -2 (the honest gradient only)", got)
	}
	if w := s.CloseWindow(); w.Sq[1] != 0 {
		t.Errorf("a quarantined worker's gradient counted in its sum: %v", w.Sq)
	}
	if _, err := s.SetMembership(Membership{Live: []int{0, 1}}); err != nil {
		t.Fatal(err)
	}
	if r := mustPush(t, s, 1, 1, grad(5)); r.Outcome != Applied {
		t.Errorf("after the quarantine is lifted: %+v", r)
	}
}

func mustPush(t *testing.T, s *Shard, w int, v int64, g []float32) PushResult {
	t.Helper()
	r, err := s.Push(w, v, g)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A shard re-initialised in the same run keeps the quarantine: a rollback
// ordered with one never lets the culprit's gradients in.
func TestQuarantineSurvivesReinit(t *testing.T) {
	old := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}, 1)
	if _, err := old.SetMembership(Membership{Live: []int{0, 1}, Quarantined: []int{1}}); err != nil {
		t.Fatal(err)
	}
	s := newTestShard(t, ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}, 1)
	s.InheritQuarantine(old)
	if r := mustPush(t, s, 1, 0, grad(5)); r.Outcome != Quarantined {
		t.Errorf("the culprit's push after the re-init: %+v, want quarantined", r)
	}
	if r := mustPush(t, s, 0, 0, grad(1)); !r.Advanced {
		t.Errorf("the honest worker's push must complete the step alone: %+v", r)
	}
}
