package launcher

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/report"
)

func TestParseFaults(t *testing.T) {
	r := config.Default() // 2 PS, 2 workers
	got, err := ParseFaults("ps/1@8s, worker/0@12.5s,chief@20s,chief/0@1m", r)
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{{Task: "ps/1", At: 8 * time.Second}, {Task: "worker/0", At: 12500 * time.Millisecond}, {Task: "chief", At: 20 * time.Second}, {Task: "chief", At: time.Minute}}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("fault %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if f, err := ParseFaults("", r); err != nil || f != nil {
		t.Errorf("empty spec: %v, %v", f, err)
	}
	for _, bad := range []string{"ps/2@1s", "worker/5@1s", "ps/0", "ps/0@soon", "ps/0@-1s", "gpu/0@1s", "ps/0@1s,,"} {
		if _, err := ParseFaults(bad, r); err == nil || !strings.Contains(err.Error(), "--fault") {
			t.Errorf("ParseFaults(%q) = %v, want an error naming --fault", bad, err)
		}
	}
}

// With hot standbys a fault may name standby/N, and the message lists
// them; without, standby/0 is no task of the run.
func TestParseFaultsStandby(t *testing.T) {
	r := config.Default() // 2 PS
	if _, err := ParseFaults("standby/0@3s", r); err == nil || strings.Contains(err.Error(), "standby/0..") {
		t.Fatalf("standby/0 without --ps-replicas: %v, want a refusal that lists no standbys", err)
	}
	r.PSReplicas = 1
	got, err := ParseFaults("standby/1@3s,ps/0@1s", r)
	if err != nil || len(got) != 2 || got[0] != (Fault{Task: "standby/1", At: 3 * time.Second}) {
		t.Fatalf("ParseFaults = %+v, %v", got, err)
	}
	if _, err := ParseFaults("standby/2@3s", r); err == nil || !strings.Contains(err.Error(), "standby/0..standby/1") {
		t.Fatalf("standby/2 of 2 shards: %v, want a refusal listing standby/0..standby/1", err)
	}
}

// The standbys are numbered after every other task, so the others keep
// their ports (and --metrics-port-base offsets) with or without them.
func TestLaunchOrderPutsStandbysLast(t *testing.T) {
	spec := cluster.Spec{Chief: []string{"c:1"}, PS: []string{"p:1", "p:2"}, Worker: []string{"w:1", "w:2", "w:3"}, Standby: []string{"s:1", "s:2"}}
	var got []string
	for _, tk := range launchOrder(spec) {
		got = append(got, tk.String())
	}
	want := "chief ps/0 ps/1 worker/0 worker/1 worker/2 standby/0 standby/1"
	if strings.Join(got, " ") != want {
		t.Fatalf("launchOrder = %q, want %q", got, want)
	}
	spec.Standby = nil
	if n := len(launchOrder(spec)); n != 6 {
		t.Fatalf("without standbys: %d tasks", n)
	}
}

// TestMergeRestarts: every time on the run's clock (the chief's are
// shifted by the start-up time), each launcher restart matched to the
// chief's record of its own recovery by time, not by order.
func TestMergeRestarts(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	back := func(s float64) *float64 { return &s }
	// Training started 2 s after the run: the chief's times are 2 s less.
	const trainStart = 1002
	chief := []report.Restart{
		{Task: "ps/1", KilledAtSeconds: 3.2, BackAtSeconds: back(4.5), RestoredStep: 100},
		{Task: "worker/0", BackAtSeconds: back(7), RestoredStep: 250},
		{Task: "worker/1", BackAtSeconds: back(10), RestoredStep: 300}, // restarted by hand
	}
	seen := []restart{
		{task: "worker/0", cause: CauseSignal, exitedAt: at(8), backAt: at(8.3)},
		{task: "ps/1", cause: CauseFault, exitedAt: at(5), backAt: at(5.3)},
		{task: "worker/0", cause: CauseUnresponsive, exitedAt: at(10), backAt: at(10.4)}, // never rejoined before the end
	}
	got := mergeRestarts(chief, seen, t0, trainStart, true)
	want := []report.Restart{
		{Task: "worker/1", KilledAtSeconds: 0, BackAtSeconds: back(12), RestoredStep: 300},                             // chief-only record kept
		{Task: "ps/1", Cause: CauseFault, KilledAtSeconds: 5, BackAtSeconds: back(6.5), RestoredStep: 100},             // kill from the launcher, the rest from the chief
		{Task: "worker/0", Cause: CauseSignal, KilledAtSeconds: 8, BackAtSeconds: back(9), RestoredStep: 250},          //
		{Task: "worker/0", Cause: CauseUnresponsive, KilledAtSeconds: 10, BackAtSeconds: back(10.4), RestoredStep: -1}, // no chief record: process start, step unknown
	}
	checkRestarts(t, got, want)
}

// TestMergeRestartsOverlappingKills: two PS killed 0.5 s apart in sync
// mode. One rollback brings both back, recorded by the chief under the
// first; a later record of ps/1 (its second death) is not taken for the
// first, and nothing is reported before it happened or with step -1.
func TestMergeRestartsOverlappingKills(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	back := func(s float64) *float64 { return &s }
	chief := []report.Restart{ // on the training clock: training began at 1 s
		{Task: "ps/0", KilledAtSeconds: 3.1, BackAtSeconds: back(4.8), RestoredStep: 120},
		{Task: "ps/1", KilledAtSeconds: 20, BackAtSeconds: back(21), RestoredStep: 500},
	}
	seen := []restart{
		{task: "ps/0", cause: CauseFault, exitedAt: at(4), backAt: at(4.3)},
		{task: "ps/1", cause: CauseFault, exitedAt: at(4.5), backAt: at(4.8)},
		{task: "ps/1", cause: CauseSignal, exitedAt: at(20.5), backAt: at(20.8)},
	}
	got := mergeRestarts(chief, seen, t0, 1001, true)
	checkRestarts(t, got, []report.Restart{
		{Task: "ps/0", Cause: CauseFault, KilledAtSeconds: 4, BackAtSeconds: back(5.8), RestoredStep: 120},
		{Task: "ps/1", Cause: CauseFault, KilledAtSeconds: 4.5, BackAtSeconds: back(5.8), RestoredStep: 120},
		{Task: "ps/1", Cause: CauseSignal, KilledAtSeconds: 20.5, BackAtSeconds: back(22), RestoredStep: 500},
	})
	// In async mode each shard is restored alone: no borrowing.
	got = mergeRestarts(chief[:1], seen[:2], t0, 1001, false)
	checkRestarts(t, got, []report.Restart{
		{Task: "ps/0", Cause: CauseFault, KilledAtSeconds: 4, BackAtSeconds: back(5.8), RestoredStep: 120},
		{Task: "ps/1", Cause: CauseFault, KilledAtSeconds: 4.5, BackAtSeconds: back(4.8), RestoredStep: -1},
	})
}

// TestMergeRestartsFailovers: with hot standbys a dead primary's record
// is the failover, back (its standby took over) before the launcher
// started the dead process again; it keeps what the chief said of it,
// and the same task's later death as a standby takes its own record.
func TestMergeRestartsFailovers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	back := func(s float64) *float64 { return &s }
	chief := []report.Restart{ // training began at 1 s
		{Task: "ps/0", KilledAtSeconds: 3.05, BackAtSeconds: back(3.15), RestoredStep: 300, TookOver: "standby/0", FailoverSeconds: 0.1},
		{Task: "ps/0", KilledAtSeconds: 11.1, BackAtSeconds: back(12.5), RestoredStep: 900},
	}
	seen := []restart{
		{task: "ps/0", cause: CauseFault, exitedAt: at(4), backAt: at(4.4)},
		{task: "ps/0", cause: CauseFault, exitedAt: at(12), backAt: at(12.4)},
	}
	got := mergeRestarts(chief, seen, t0, 1001, true)
	checkRestarts(t, got, []report.Restart{
		// The failover took 0.15 s from the death, 0.1 s from the chief's poll.
		{Task: "ps/0", Cause: CauseFault, KilledAtSeconds: 4, BackAtSeconds: back(4.15), RestoredStep: 300, TookOver: "standby/0", FailoverSeconds: 0.15},
		{Task: "ps/0", Cause: CauseFault, KilledAtSeconds: 12, BackAtSeconds: back(13.5), RestoredStep: 900},
	})
}

func checkRestarts(t *testing.T, got, want []report.Restart) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d restarts, want %d: %+v", len(got), len(want), got)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
	for i, w := range want {
		g := got[i]
		if g.Task != w.Task || g.Cause != w.Cause || !near(g.KilledAtSeconds, w.KilledAtSeconds) || g.BackAtSeconds == nil ||
			!near(*g.BackAtSeconds, *w.BackAtSeconds) || g.RestoredStep != w.RestoredStep || g.StepsLost != w.StepsLost ||
			g.TookOver != w.TookOver || !near(g.FailoverSeconds, w.FailoverSeconds) {
			t.Errorf("restart %d: %+v (back %v), want %+v (back %v)", i, g, deref(g.BackAtSeconds), w, *w.BackAtSeconds)
		}
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestExitCause(t *testing.T) {
	for script, want := range map[string]string{"exit 0": CauseExitZero, "exit 3": CauseExitNonZero, "kill -9 $$": CauseSignal} {
		cmd := exec.Command("sh", "-c", script)
		cmd.Run()
		if got := exitCause(cmd.ProcessState); got != want {
			t.Errorf("%s: cause %q, want %q", script, got, want)
		}
	}
}

func TestStopBegun(t *testing.T) {
	p := filepath.Join(t.TempDir(), "chief-state.json")
	if stopBegun(p, "run-1") {
		t.Error("no state file: stop begun")
	}
	for state, want := range map[string]bool{
		`{"run_id":"run-1","stopped_by":"epochs"}`: true,
		`{"run_id":"run-1"}`:                       false,
		`{"run_id":"run-0","stopped_by":"epochs"}`: false, // an earlier run's
		`{"run_id":"run-1","stopped_by":`:          false,
	} {
		os.WriteFile(p, []byte(state), 0o644)
		if got := stopBegun(p, "run-1"); got != want {
			t.Errorf("%s: stop begun = %v, want %v", state, got, want)
		}
	}
}

// TestJudgeChiefExits: how the launcher takes a chief's exit status: a
// signal's (the run stopped cleanly) and 3 (finished, final checkpoint
// failed) end the run as done; 4 (the chief gave up on purpose) fails it
// without a restart; 1 (a crash) is restarted.
func TestJudgeChiefExits(t *testing.T) {
	s := &supervisor{}
	for code, want := range map[int]exitVerdict{130: taskDone, 143: taskDone, ExitFinalCheckpointFailed: taskDone,
		ExitChiefGaveUp: taskFailed, 1: taskCrash} {
		cmd := exec.Command("sh", "-c", fmt.Sprintf("exit %d", code))
		err := cmd.Run()
		p := &proc{task: cluster.Task{Type: cluster.Chief}, cmd: cmd, err: err}
		if got := s.judge(context.Background(), p); got != want {
			t.Errorf("chief exiting %d: verdict %v, want %v", code, got, want)
		}
	}
}
