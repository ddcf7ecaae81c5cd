package main

import (
	"context"
	"os"
	"path/filepath"
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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	run := startRun(t, ctx, dir, "--mode", "sync", "--batch", "64", "--data-fraction", "0.1", "--epochs", "8",
		"--lr", "0.05", "--lr-schedule", "constant", "--checkpoint-dir", filepath.Join(dir, "ck"), "--checkpoint-every", "0s",
		"--max-ps", "3")
	run.waitTraining(60 * time.Second)
	if out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--ps", "3"); err != nil {
		t.Fatalf("pstrain scale --ps 3: %v\n%s", err, out)
	}
	ckdir := filepath.Join(dir, "ck")
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
