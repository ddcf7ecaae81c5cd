package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPSKilledDuringTheSwitchIsARestart: ps/2, a slot a 2 -> 3 change
// adds, is killed (-9) as soon as the boundary's checkpoint, the run's
// first, is committed: the change is then waiting for the workers to
// switch layouts, or switching. The switch's Init
// reaches its restarted process, and the report records the restart
// with the step the switch initialised it at and no step lost, where
// the summary said "not back in training before the end".
func TestPSKilledDuringTheSwitchIsARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	run, ckdir := scaledTo3(t, 8)
	waitCheckpointPast(run, ckdir, 0)
	if err := syscall.Kill(run.pid("ps/2"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitPSChanges(run, 1)
	rep := run.finish(2 * time.Minute)
	if len(rep.MembershipChanges) != 1 || *rep.MembershipChanges[0].StepsLost != 0 {
		t.Fatalf("membership changes %+v: want one, 2 -> 3 with 0 steps lost", rep.MembershipChanges)
	}
	step := rep.MembershipChanges[0].Step
	var found bool
	for _, r := range rep.Restarts {
		t.Logf("restart %+v", r)
		if r.Task == "ps/2" {
			found = true
			if r.BackAtSeconds == nil || r.RestoredStep != step || r.StepsLost != 0 {
				t.Errorf("ps/2's restart %+v: want back, at the change's step %d, 0 steps lost", r, step)
			}
		}
	}
	if !found {
		t.Fatalf("no restart of ps/2 in the report:\n%s", run.out)
	}
	log, err := os.ReadFile(filepath.Join(run.dir, "logs", "chief.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "restarted during the PS count change") {
		t.Errorf("the chief did not see ps/2 come back during the change:\n%s", log)
	}
	if strings.Contains(run.out.String(), "not back in training") {
		t.Errorf("the summary says a task is not back in training:\n%s", run.out)
	}
}

// TestChiefKilledDuringAPSChangeTakesItUp: the chief is killed (-9) as
// a 2 -> 3 change begins; `pstrain run` restarts it, and the new chief,
// adopting the run, takes the change up again from its saved state and
// finishes it, with no step lost.
func TestChiefKilledDuringAPSChangeTakesItUp(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	run, _ := scaledTo3(t, 12)
	chiefLog := filepath.Join(run.dir, "logs", "chief.log")
	waitFileHas(t, run, chiefLog, "PS count change: waiting for the added parameter servers")
	// The change's state is saved as it begins, in the same loop
	// iteration; the chief then waits for ps/2 to register.
	state := filepath.Join(run.dir, "chief-state.json")
	waitFileHas(t, run, state, `"ps_asked"`)
	if err := syscall.Kill(run.pid("chief"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitPSChanges(run, 1)
	rep := run.finish(2 * time.Minute)
	if len(rep.MembershipChanges) != 1 || rep.MembershipChanges[0].To != 3 || *rep.MembershipChanges[0].StepsLost != 0 || rep.FinalPS != 3 {
		t.Fatalf("membership changes %+v, final PS %d: want 2 -> 3 with 0 steps lost", rep.MembershipChanges, rep.FinalPS)
	}
	var chief bool
	for _, r := range rep.Restarts {
		chief = chief || r.Task == "chief"
		if r.Task != "chief" {
			t.Errorf("a restart of %s in the report, which only the chief had: %+v", r.Task, r)
		}
	}
	if !chief {
		t.Errorf("no restart of the chief in the report: %+v", rep.Restarts)
	}
	log, err := os.ReadFile(chiefLog)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "taking up the PS count change") {
		t.Errorf("the restarted chief did not take the change up (its log):\n%s", log)
	}
}

// waitFileHas waits until the file at path holds s.
func waitFileHas(t *testing.T, run *liveRun, path, s string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), s) {
			return
		}
		select {
		case <-run.done:
			t.Fatalf("the run ended before %s held %q:\n%s", path, s, run.out)
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not hold %q within a minute", path, s)
}

// TestChiefKilledDuringASwitchSwitchesAgain: the chief dies (-9) in the
// middle of a 2 -> 3 change's switch, held there by ps/2, frozen
// (SIGSTOP) from the boundary's checkpoint on, so that its Init cannot
// land. The restarted chief finds the switch in its saved state and
// does it again, every shard of the new layout initialised from the
// boundary's checkpoint: the run ends on 3 PS, the change recorded.
func TestChiefKilledDuringASwitchSwitchesAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	run, ckdir := scaledTo3(t, 12)
	waitCheckpointPast(run, ckdir, 0)
	ps2 := run.pid("ps/2")
	if err := syscall.Kill(ps2, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFileHas(t, run, filepath.Join(run.dir, "chief-state.json"), `"ps_switch"`)
	if err := syscall.Kill(run.pid("chief"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(ps2, syscall.SIGCONT); err != nil {
		t.Logf("SIGCONT ps/2: %v (restarted meanwhile?)", err)
	}
	waitPSChanges(run, 1)
	rep := run.finish(2 * time.Minute)
	if len(rep.MembershipChanges) != 1 || rep.MembershipChanges[0].To != 3 || rep.FinalPS != 3 {
		t.Fatalf("membership changes %+v, final PS %d: want 2 -> 3", rep.MembershipChanges, rep.FinalPS)
	}
	log, err := os.ReadFile(filepath.Join(run.dir, "logs", "chief.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "died during a PS count change's switch: switching again") {
		t.Errorf("the restarted chief did not switch again (its log):\n%s", log)
	}
	t.Logf("2 -> 3 at step %d, %d steps lost, pause %.2f s", rep.MembershipChanges[0].Step, *rep.MembershipChanges[0].StepsLost,
		*rep.MembershipChanges[0].PauseSeconds)
}

// scaledTo3 starts a sync run of epochs epochs (of a tenth of MNIST) on
// 2 of 3 PS slots, with a checkpoint directory and no periodic
// checkpoint, and asks it for 3 PS once it trains; it returns the run
// and its checkpoint directory.
func scaledTo3(t *testing.T, epochs int) (*liveRun, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	dir := t.TempDir()
	ckdir := filepath.Join(dir, "ck")
	run := startRun(t, ctx, dir, "--mode", "sync", "--batch", "64", "--data-fraction", "0.1", "--epochs", strconv.Itoa(epochs),
		"--lr", "0.05", "--lr-schedule", "constant", "--checkpoint-dir", ckdir, "--checkpoint-every", "0s", "--max-ps", "3")
	run.waitTraining(60 * time.Second)
	if out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--ps", "3"); err != nil {
		t.Fatalf("pstrain scale --ps 3: %v\n%s", err, out)
	}
	return run, ckdir
}
