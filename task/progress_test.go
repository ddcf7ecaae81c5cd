package task

import (
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/chief"
)

// snap is the chief's snapshot at step after elapsed, with 256 samples a
// step (the chief's rate is over the whole of elapsed).
func snap(step int64, elapsed time.Duration, loss float32) chief.Progress {
	return chief.Progress{Step: step, MaxStep: 1000, Epoch: float64(step) / 100, SamplesPerSec: float64(step*256) / elapsed.Seconds(),
		Loss: loss, LastAccuracy: -1, Elapsed: elapsed, LiveWorkers: 2}
}

func TestProgressLines(t *testing.T) {
	var pl progressLines
	ms := time.Millisecond
	for _, p := range []chief.Progress{
		{MaxStep: 1000, Elapsed: 100 * ms}, // no step yet: nothing (not "0 samples/s, ETA 0.0s")
		snap(1, 300*ms, 2.3),               // the first step: the window starts
		snap(5, 900*ms, 1.9),               // not a second of it yet
	} {
		if s, ok := pl.next(p); ok {
			t.Fatalf("step %d at %v printed %q; want nothing before a rate is measured", p.Step, p.Elapsed, s)
		}
	}
	// 99 steps of 256 samples in 1.1 s since the first step: 23040 samples/s;
	// 900 steps left at 90 steps/s: 10 s.
	s, ok := pl.next(snap(100, 1400*ms, 0.5))
	if !ok {
		t.Fatal("no line a second after the first step")
	}
	for _, want := range []string{"step    100/1000", "23040 samples/s", "loss 0.5000", "ETA   10.0s", "elapsed   1.4s", "test acc   -   "} {
		if !strings.Contains(s, want) {
			t.Errorf("line %q lacks %q", s, want)
		}
	}
	// A CTR model's line gives its AUC, an MLP's its accuracy.
	for _, c := range []struct {
		acc, auc float64
		want     string
	}{{0.9751, 0, "test acc 97.51%"}, {0.7992, 0.80951, "test auc 0.8095"}} {
		p := snap(100, 1400*ms, 0.5)
		p.LastAccuracy, p.LastAUC = c.acc, c.auc
		if got := formatProgress(p, snap(1, 300*ms, 2.3)); !strings.Contains(got, c.want) {
			t.Errorf("line %q lacks %q", got, c.want)
		}
	}
	if _, ok := pl.next(snap(150, 2000*ms, 0.4)); ok {
		t.Error("a line 0.6 s after the previous one")
	}
	// The rate is the last window's, not the run's average: 100 steps in 1.2 s.
	s, ok = pl.next(snap(200, 2600*ms, 0))
	if !ok || !strings.Contains(s, "21333 samples/s") || !strings.Contains(s, "ETA    9.6s") {
		t.Errorf("second line %q, %v; want 21333 samples/s and ETA 9.6s", s, ok)
	}
	if !strings.Contains(s, "loss    -  ") {
		t.Errorf("line %q: a loss of 0 (no push since the shard restarted) should print as -", s)
	}
	// Stalled (a shard being restored): no rate, no ETA.
	if s, ok = pl.next(snap(200, 3700*ms, 0.3)); !ok || !strings.Contains(s, "      0 samples/s") || !strings.Contains(s, "ETA       -") {
		t.Errorf("stalled line %q, %v; want 0 samples/s and no ETA", s, ok)
	}
	// A rollback starts a new window instead of a negative rate.
	if s, ok := pl.next(snap(150, 4800*ms, 0.3)); ok {
		t.Errorf("rollback printed %q", s)
	}
	if s, ok := pl.next(snap(250, 5800*ms, 0.3)); !ok || !strings.Contains(s, "25600 samples/s") {
		t.Errorf("after the rollback: %q, %v; want 25600 samples/s", s, ok)
	}
}
