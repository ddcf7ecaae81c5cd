package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

// stragglerRun trains the default cluster (sync, unless extra says) for
// 2 epochs of MNIST (about 7 s undisturbed on 2 cores) with the given
// --fault, and returns its report and output; the run's directory is
// run in the test's temporary directory, or runDir's.
func stragglerRun(t *testing.T, fault string, extra ...string) (*report.Report, string) {
	return stragglerRunIn(t, filepath.Join(t.TempDir(), "run"), fault, extra...)
}

func stragglerRunIn(t *testing.T, runDir, fault string, extra ...string) (*report.Report, string) {
	t.Helper()
	d, tmp := testbin.MNIST(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rp := filepath.Join(tmp, "report.json")
	args := append([]string{"run", "--data-dir", d, "--epochs", "2", "--target-accuracy", "0", "--eval-every", "0",
		"--run-dir", runDir, "--sd-dir", filepath.Join(tmp, "targets"), "--report", rp, "--fault", fault}, extra...)
	out, err := pstrain(t, ctx, args...)
	if err != nil {
		t.Fatalf("pstrain run --fault %q: %v\n%s", fault, err, out)
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	return rep, out
}

// A worker slowed to a third of its speed from 2 s into a sync run is
// named as the straggler within 10 s, with its slowdown; an undisturbed
// run names none.
func TestStragglerNamed(t *testing.T) {
	if testing.Short() {
		t.Skip("two runs of the default cluster")
	}
	const at = 2.0 // seconds: the slowdown's start
	rep, out := stragglerRun(t, "slow:worker/1@2s:3")
	t.Logf("stragglers %+v; bottleneck: %s", rep.Stragglers, rep.Bottleneck)
	if len(rep.Stragglers) != 1 || rep.Stragglers[0].Task != "worker/1" {
		t.Fatalf("stragglers %+v, want worker/1 alone\n%s", rep.Stragglers, out)
	}
	s := rep.Stragglers[0]
	if s.Slowdown < 1.7 || s.Slowdown > 4.5 {
		t.Errorf("worker/1's slowdown %.2f, want 1.7..4.5 (slowed 3x; the others speed up on the CPU it gives up)", s.Slowdown)
	}
	if s.DetectedAtSeconds < at || s.DetectedAtSeconds > at+10 {
		t.Errorf("worker/1 counted at %.1f s, want within 10 s of the slowdown at %.0f s", s.DetectedAtSeconds, at)
	}
	if !strings.Contains(out, "straggler at ") || !strings.Contains(out, ": worker/1 is ") {
		t.Errorf("the progress does not name worker/1 as a straggler:\n%s", out)
	}
	if !strings.Contains(out, "\nstraggler: worker/1, ") {
		t.Errorf("the summary does not name worker/1 as a straggler:\n%s", out)
	}

	rep, out = stragglerRun(t, "")
	if rep.Stragglers == nil || len(rep.Stragglers) != 0 || strings.Contains(out, "straggler at ") || strings.Contains(out, "\nstraggler: ") {
		t.Errorf("undisturbed run: stragglers %+v, want none (an empty list)\n%s", rep.Stragglers, out)
	}
}

// In an async run a worker slowed to a third of its speed reads less of
// every epoch from the data queue (docs/elastic.md, "The data queue"):
// the run trains its three epochs, every epoch but the last two (which
// may hold chunks the workers were handed and did not read by the end)
// holds each sample once, and the slow worker read well under half the
// other's batches. The chief is killed half way: the queue it had
// handed out survives its restart.
func TestSlowWorkerReadsLessFromTheQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("a run of the default cluster")
	}
	dir := filepath.Join(t.TempDir(), "run")
	rep, out := stragglerRunIn(t, dir, "slow:worker/1@1s:3,chief@step:700", "--mode", "async", "--epochs", "3")
	q := rep.DataQueue
	if q == nil || len(q.BatchesRead) != 2 {
		t.Fatalf("data queue %+v, want the two workers' reading\n%s", q, out)
	}
	t.Logf("data queue %+v; samples/s %.0f; stragglers %+v", q, rep.SamplesPerSecond, rep.Stragglers)
	if r := float64(q.BatchesRead[1]) / float64(q.BatchesRead[0]); r > 0.6 {
		t.Errorf("the slowed worker read %d batches, the other %d (%.2f): want it to read much less", q.BatchesRead[1], q.BatchesRead[0], r)
	}
	if rep.StoppedBy != "epochs" || rep.DataLedger == nil || len(rep.DataLedger) > 0 {
		t.Errorf("stopped by %s, data ledger %+v: want the epochs run with no sample read twice or skipped", rep.StoppedBy, rep.DataLedger)
	}
	if len(rep.Stragglers) == 0 || rep.Stragglers[0].Task != "worker/1" {
		t.Errorf("stragglers %+v, want worker/1 named", rep.Stragglers)
	}
	if len(rep.Restarts) != 1 || rep.Restarts[0].Task != "chief" || rep.Restarts[0].RestoredStep < 700 {
		t.Errorf("restarts %+v, want the chief's, back past step 700", rep.Restarts)
	}
	var st elasticState
	b, err := os.ReadFile(filepath.Join(dir, "chief-state.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	latest, _, err2 := checkpoint.NewStore(checkpoint.OSFS{}, filepath.Join(dir, "checkpoints"), 0).Latest()
	if err != nil || err2 != nil || latest.Manifest == nil {
		t.Fatalf("chief state: %v; checkpoint: %v", err, err2)
	}
	ledger := epochLedger(st.Plan, latest.Manifest.DataPositions)
	if len(ledger) < 3 {
		t.Fatalf("ledger %+v: want three epochs or more", ledger)
	}
	for e, l := range ledger[:len(ledger)-2] {
		if l.read != l.want {
			t.Errorf("epoch %d: %d batches read, want %d (ledger %+v)", e, l.read, l.want, ledger)
		}
	}
}
