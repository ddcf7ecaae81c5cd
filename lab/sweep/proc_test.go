package sweep

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"testing"
	"time"
)

const statA = `cpu  100 5 50 1000 20 3 2 0 0 0
cpu0 50 2 25 500 10 1 1 0 0 0
intr 12345
ctxt 999
procs_running 3
procs_blocked 0
`

const statB = `cpu  400 5 150 1600 25 5 4 10 0 0
cpu0 200 2 75 800 12 2 2 5 0 0
procs_running 1
`

func TestHostStat(t *testing.T) {
	a, err := parseHostStat([]byte(statA))
	if err != nil || a.busy != 100+5+50+3+2+0 || a.running != 3 {
		t.Fatalf("%+v %v", a, err)
	}
	b, err := parseHostStat([]byte(statB))
	if err != nil || b.busy != 400+5+150+5+4+10 {
		t.Fatalf("%+v %v", b, err)
	}
	// (574 - 160) ticks of 1/100 s, idle and iowait left out.
	if got := busySeconds(a, b); math.Abs(got-4.14) > 1e-9 {
		t.Errorf("busy seconds %v, want 4.14", got)
	}
	if got := busySeconds(b, a); got != 0 {
		t.Errorf("a counter going back gave %v", got)
	}
	for _, bad := range []string{"", "cpu 1 2 3\nprocs_running 1\n", "cpu  1 2 3 4 5 6 7 8\n", "cpu  1 2 3 4 5 6 7 x\nprocs_running 1\n"} {
		if _, err := parseHostStat([]byte(bad)); err == nil {
			t.Errorf("parseHostStat(%q) accepted", bad)
		}
	}
}

func TestEvidenceArithmetic(t *testing.T) {
	var q runQueue
	if m, top := q.stats(); m != 0 || top != 0 {
		t.Errorf("empty %v %v", m, top)
	}
	for _, n := range []int{1, 3, 5, 0} { // the reader counts itself: 0, 2, 4, 0
		q.add(n)
	}
	if m, top := q.stats(); m != 1.5 || top != 4 || q.n != 4 {
		t.Errorf("mean %v max %v n %d, want 1.5 4 4", m, top, q.n)
	}
	e := Evidence{RunCPUSeconds: 12.5, HostCPUSeconds: 20}
	if e.OtherCPUSeconds() != 7.5 {
		t.Errorf("other %v", e.OtherCPUSeconds())
	}
	// Rounding to ticks can make the run's share exceed the host's.
	if (Evidence{RunCPUSeconds: 3.01, HostCPUSeconds: 3}).OtherCPUSeconds() != 0 {
		t.Error("negative other CPU time")
	}
	var r Row
	r.setEvidence(Evidence{RunCPUSeconds: 1, HostCPUSeconds: 3, CPUsAllowed: "0"})
	if r.OtherCPUSeconds != 2 || r.CPUsAllowed != "0" || r.RunQueueMean != 0 {
		t.Errorf("row %+v", r)
	}
}

func TestProcessTree(t *testing.T) {
	for stat, want := range map[string]int{
		"42 (pstrain) S 7 42 42 0": 7,
		"43 (a b) c)) R 42 1 1":    42,
	} {
		if got, err := parentPID([]byte(stat)); err != nil || got != want {
			t.Errorf("parentPID(%q) = %d, %v", stat, got, err)
		}
	}
	if _, err := parentPID([]byte("42 pstrain")); err == nil {
		t.Error("stat without a command name accepted")
	}
	parents := map[int]int{10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 21: 20}
	got := descendants(parents, 10)
	slices.Sort(got[1:])
	if !reflect.DeepEqual(got, []int{10, 11, 12, 13}) {
		t.Errorf("descendants %v", got)
	}
}

// The watcher sees a real child's affinity through /proc.
func TestWatchSeesAffinity(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset")
	}
	cmd := exec.Command("taskset", "-c", "0", "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	w := procWatcher{root: "/proc", every: 10 * time.Millisecond}
	// taskset execs sleep once it set the affinity: wait for that.
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		if string(b) == "sleep\n" || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // one sample
	ev := w.watch(ctx, cmd.Process.Pid)
	if ev.CPUsAllowed != "0" || ev.Processes != 1 || ev.RunQueueSamples != 1 {
		t.Errorf("evidence %+v", ev)
	}
}

func TestStartupShare(t *testing.T) {
	r := Row{StartupSeconds: 2, WallSeconds: 16}
	if v, ok := r.Metric("startup_share"); !ok || v != 0.125 {
		t.Errorf("startup_share %v %v, want 0.125", v, ok)
	}
	if v := (&Row{StartupSeconds: 2}).StartupShare(); !math.IsNaN(v) {
		t.Errorf("no wall time gave %v", v)
	}
}
