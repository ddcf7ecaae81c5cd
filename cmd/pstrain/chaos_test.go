package main

// The chaos test: a seeded random schedule of kills, freezes
// and a full disk over a short run. The short schedule runs in `make
// test`; `make chaos` runs a longer one (-chaos.long) and BENCHMARKS.md
// has its figures.

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
)

var (
	chaosLong = flag.Bool("chaos.long", false, "run the long chaos schedule (make chaos)")
	chaosSeed = flag.Uint64("chaos.seed", 19, "seed of the chaos schedule")
)

// chaosEvent is one fault: kill (SIGKILL by the launcher's --fault),
// freeze (SIGSTOP by the test, held until the launcher finds the task
// unresponsive and kills it) or disk (the checkpoint disk filled for
// hold, then freed).
type chaosEvent struct {
	at   time.Duration // since pstrain run started
	kind string        // "kill", "freeze" or "disk"
	task string        // kill, freeze: "ps/1", "chief", ...
	hold time.Duration // disk: how long it stays full
}

func (e chaosEvent) String() string {
	if e.kind == "disk" {
		return fmt.Sprintf("disk full at %v for %v", e.at, e.hold)
	}
	return fmt.Sprintf("%s %s at %v", e.kind, e.task, e.at)
}

// chaosSchedule draws n faults from seed, the first at start, then one
// every gap plus up to gap/2 more: each kind at least once (n >= 3),
// kills of a PS or the chief, freezes of a PS (the task a freeze stalls
// the whole cluster for), one disk event.
func chaosSchedule(seed uint64, n int, start, gap time.Duration, ps int) []chaosEvent {
	rng := rand.New(rand.NewPCG(seed, 0x19))
	kinds := []string{"kill", "freeze", "disk"}
	for len(kinds) < n {
		kinds = append(kinds, []string{"kill", "kill", "freeze"}[rng.IntN(3)])
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	var out []chaosEvent
	at := start
	for _, k := range kinds[:n] {
		e := chaosEvent{at: at, kind: k}
		switch k {
		case "kill":
			if rng.IntN(3) == 0 {
				e.task = "chief"
			} else {
				e.task = fmt.Sprintf("ps/%d", rng.IntN(ps))
			}
		case "freeze":
			e.task = fmt.Sprintf("ps/%d", rng.IntN(ps))
		case "disk":
			e.hold = gap
		}
		out = append(out, e)
		at += gap + time.Duration(rng.Int64N(int64(gap/2)))
	}
	return out
}

func TestChaosScheduleIsSeeded(t *testing.T) {
	a := chaosSchedule(7, 5, 3*time.Second, 4*time.Second, 2)
	b := chaosSchedule(7, 5, 3*time.Second, 4*time.Second, 2)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("same seed, two schedules:\n%v\n%v", a, b)
	}
	if c := chaosSchedule(8, 5, 3*time.Second, 4*time.Second, 2); fmt.Sprint(a) == fmt.Sprint(c) {
		t.Errorf("seeds 7 and 8 drew the same schedule %v", a)
	}
	seen := map[string]bool{}
	for i, e := range a {
		seen[e.kind] = true
		if i > 0 && e.at-a[i-1].at < 4*time.Second {
			t.Errorf("events %d and %d are %v apart, want >= the gap", i-1, i, e.at-a[i-1].at)
		}
		if e.kind != "disk" && e.task == "" {
			t.Errorf("%v names no task", e)
		}
	}
	if len(seen) != 3 {
		t.Errorf("schedule %v lacks a kind", a)
	}
}

// fillDisk fills the file system of dir and returns a func that frees it.
func fillDisk(t *testing.T, dir string) func() {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			break // ENOSPC: full
		}
	}
	f.Close()
	return func() { os.Remove(p) }
}

// TestChaos: a seeded schedule of faults over a sync run (PS and chief
// kills, a PS frozen until the launcher kills it, the checkpoint disk
// full for a while): the run finishes every step, each worker's data
// was used exactly once (the final checkpoint's data positions are the
// final step: every step holds one batch of each worker, none twice),
// the accuracy is within 0.5 point of an undisturbed run with the same
// seed, and every fault is in the report.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process chaos test")
	}
	testbin.MNIST(t)
	// The schedule must end well before the run: 15 epochs train for
	// about 17 s on a quiet machine (53,000 samples/s; 5 epochs would end
	// before the last fault), the faults are over by 3 + 2 x 4.5 = 12 s.
	// The long schedule's last fault comes at 3 + 9 x 7.5 = 70.5 s at
	// most: 80 epochs train for about 90 s on a quiet machine, plus what
	// the faults cost (20 epochs ended before the last two faults).
	n, epochs, gap := 3, "15", 3*time.Second
	if *chaosLong {
		n, epochs, gap = 10, "80", 5*time.Second
	}
	events := chaosSchedule(*chaosSeed, n, 3*time.Second, gap, 2)
	t.Logf("seed %d: %v", *chaosSeed, events)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	common := []string{"--mode", "sync", "--epochs", epochs, "--task-timeout", "2s"}

	base := startRun(t, ctx, t.TempDir(), common...).finish(5 * time.Minute)
	t.Logf("undisturbed: %.2f%% after %d steps", 100*base.TestAccuracy, base.GlobalSteps)

	disk := smallDisk(t, "64m")
	ckdir := filepath.Join(disk, "ck")
	var faults []string
	for _, e := range events {
		if e.kind == "kill" {
			faults = append(faults, fmt.Sprintf("%s@%s", e.task, e.at))
		}
	}
	// One checkpoint kept: a full disk then has nothing older to free, so
	// checkpoints fail (loudly) until it has room again.
	args := append(slices.Clone(common), "--checkpoint-dir", ckdir, "--keep-checkpoints", "1")
	if len(faults) > 0 {
		args = append(args, "--fault", strings.Join(faults, ","))
	}
	start := time.Now()
	run := startRun(t, ctx, t.TempDir(), args...)
	for _, e := range events {
		if e.kind == "kill" {
			continue
		}
		select {
		case <-time.After(time.Until(start.Add(e.at))):
		case <-run.done:
			t.Fatalf("the run ended before %v:\n%s", e, run.out)
		}
		switch e.kind {
		case "freeze":
			// The pid of the task's current process, stopped until the
			// launcher finds it unresponsive and kills it.
			if err := syscall.Kill(run.pid(e.task), syscall.SIGSTOP); err != nil {
				t.Fatalf("%v: %v", e, err)
			}
		case "disk":
			free := fillDisk(t, disk)
			select {
			case <-time.After(e.hold):
			case <-run.done:
			}
			free()
		}
	}
	rep := run.finish(10 * time.Minute)
	t.Logf("chaos: %.2f%% after %d steps, %d restarts, checkpoints %+v", 100*rep.TestAccuracy, rep.GlobalSteps, len(rep.Restarts), rep.Checkpoints)

	if rep.GlobalSteps != base.GlobalSteps || rep.FinalStep != base.FinalStep {
		t.Errorf("chaos run: %d steps (final %d), undisturbed %d (final %d)", rep.GlobalSteps, rep.FinalStep, base.GlobalSteps, base.FinalStep)
	}
	if d := math.Abs(rep.TestAccuracy - base.TestAccuracy); d > 0.005 {
		t.Errorf("accuracy %.4f vs undisturbed %.4f: %.2f points apart, want <= 0.5", rep.TestAccuracy, base.TestAccuracy, 100*d)
	}
	// Exactly once: the final checkpoint holds every worker's first
	// final-step batches, each once.
	latest, _, err := checkpoint.NewStore(checkpoint.OSFS{}, ckdir, 0).Latest()
	if err != nil {
		t.Fatal(err)
	}
	m := latest.Manifest
	// (Its directory is named by the newest shard version, which may be a
	// step past the model's: docs/recovery.md, "The final checkpoint".)
	if m == nil || !m.Final || m.Version != rep.FinalStep {
		t.Fatalf("the newest checkpoint is %+v, want the final one at step %d", latest, rep.FinalStep)
	}
	for w, pos := range m.DataPositions {
		if pos != rep.FinalStep {
			t.Errorf("worker/%d's data position %d in the final checkpoint, want %d (step %d)", w, pos, rep.FinalStep, rep.FinalStep)
		}
	}
	// Every fault is in the report.
	causes := map[string]int{}
	for _, r := range rep.Restarts {
		causes[r.Task+" "+r.Cause]++
		checkRestart(t, r)
	}
	for _, e := range events {
		switch e.kind {
		case "kill":
			if causes[e.task+" fault"] == 0 {
				t.Errorf("%v: no restart of %s with cause fault in %+v", e, e.task, rep.Restarts)
			}
			causes[e.task+" fault"]--
		case "freeze":
			if causes[e.task+" unresponsive"] == 0 {
				t.Errorf("%v: no restart of %s with cause unresponsive in %+v", e, e.task, rep.Restarts)
			}
			causes[e.task+" unresponsive"]--
		case "disk":
			if rep.Checkpoints.Failed == 0 {
				t.Errorf("%v: no failed checkpoint in the report %+v", e, rep.Checkpoints)
			}
		}
	}
	if rep.Checkpoints.FinalFailed || rep.Checkpoints.Committed == 0 {
		t.Errorf("checkpoints %+v: the final one must commit once the disk has room", rep.Checkpoints)
	}
}
