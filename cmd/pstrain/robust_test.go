package main

// Multi-process tests of attribution and quarantine (docs/security.md,
// "Attribution"): worker 1 flips the sign of its gradient and
// quadruples it at every step. With two workers (the mean) the model is
// wrecked within a few steps; with three (the trimmed mean) it holds but
// trains slower. Either way the chief names worker/1 from its
// evaluations, quarantines it (never worker/0), and the run hands back a
// model within a point of an undisturbed run's. The fresh checkpoints
// are private: directories 0700, files 0600.

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

func TestPoisonerQuarantined(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process attribution tests are slow")
	}
	testbin.MNIST(t)
	bin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	flip := []string{"--fault-gradient", "worker/1@every:-4"}
	trimmed := []string{"--aggregate", "trimmed-mean"}
	// Two workers: all of MNIST for one epoch (235 steps); once worker/1
	// is quarantined worker/0 trains alone, on half the samples a step,
	// so a shorter run would end more than a point behind. Three
	// workers: half of MNIST (79 steps of 3 x 128).
	runs := runAll(t, ctx, map[string][]string{
		"2-undisturbed": guardArgs("2", "1"),
		"2-poisoned":    guardArgs("2", "1", flip...),
		"3-undisturbed": guardArgs("3", "0.5", trimmed...),
		"3-poisoned":    guardArgs("3", "0.5", append(trimmed, flip...)...),
		// One gradient of step 30 times 1e4, the norm guard off: the
		// model diverges, maybe before its first evaluation, which is
		// judged against the initial model's loss; it is rolled back.
		"2-huge-30": guardArgs("2", "1", "--norm-guard", "0", "--nan-policy", "skip", "--fault-gradient", "worker/1@30:1e4"),
	})
	huge := runs["2-huge-30"].rep
	if len(huge.Divergences) == 0 || huge.Divergences[0].RolledBackTo < 0 || huge.Divergences[0].AtStep < 30 || huge.Ruined != "" {
		t.Errorf("a gradient of step 30 times 1e4: divergences %+v, ruined %q; want one after step 30, rolled back\n%s",
			huge.Divergences, huge.Ruined, runs["2-huge-30"].out)
	}
	closeTo(t, "worker/1's gradient of step 30 times 1e4", huge, runs["2-undisturbed"].rep)
	t.Logf("a gradient of step 30 times 1e4: %.2f%%, divergences %+v", 100*huge.TestAccuracy, huge.Divergences)
	for _, n := range []string{"2", "3"} {
		base, got := runs[n+"-undisturbed"], runs[n+"-poisoned"]
		if len(base.rep.Suspects) != 0 || len(base.rep.Quarantined) != 0 || len(base.rep.Divergences) != 0 {
			t.Errorf("%s workers, undisturbed: suspects %+v, quarantined %v, divergences %+v", n, base.rep.Suspects, base.rep.Quarantined, base.rep.Divergences)
		}
		rep, out := got.rep, got.out
		if !slices.Equal(rep.Quarantined, []string{"worker/1"}) {
			t.Errorf("%s workers: quarantined %v, want [worker/1]\n%s", n, rep.Quarantined, out)
		}
		for _, s := range rep.Suspects {
			if s.Worker != "worker/1" {
				t.Errorf("%s workers: suspect %+v: only worker/1 poisons", n, s)
			}
		}
		if len(rep.Suspects) == 0 || !strings.Contains(out, "suspect: worker/1") || !strings.Contains(out, "ended:   worker/1") {
			t.Errorf("%s workers: the summary does not name worker/1 as suspect and ended:\n%s", n, out)
		}
		if !hasEnded(rep, "worker/1", "quarantined") || rep.Tasks["worker/1"].Ended != "quarantined" {
			t.Errorf("%s workers: restarts %+v, tasks[worker/1] %+v: want worker/1 ended, quarantined", n, rep.Restarts, rep.Tasks["worker/1"])
		}
		// The summary's worker count shows the quarantine.
		k, _ := strconv.Atoi(n)
		if want := fmt.Sprintf("%d workers, %d from ", k, k-1); !strings.Contains(out, want) {
			t.Errorf("%s workers: the summary lacks %q (live workers %+v):\n%s", n, want, rep.LiveWorkers, out)
		}
		if rep.Ruined != "" {
			t.Errorf("%s workers: ruined %q", n, rep.Ruined)
		}
		closeTo(t, n+" workers, worker/1 flipping", rep, base.rep)
		t.Logf("%s workers: undisturbed %.2f%%, poisoned %.2f%%, suspects %+v, divergences %+v", n,
			100*base.rep.TestAccuracy, 100*rep.TestAccuracy, rep.Suspects, rep.Divergences)
	}
	checkPrivate(t, filepath.Join(runs["2-poisoned"].dir, "run", "checkpoints"))
}

// hasEnded says the report records task's process as ended for cause
// and never back.
func hasEnded(rep *report.Report, task, cause string) bool {
	for _, r := range rep.Restarts {
		if r.Task == task && r.Cause == cause && r.BackAtSeconds == nil {
			return true
		}
	}
	return false
}

// checkPrivate checks what `stat -c %a` would say of a checkpoint
// directory and its shards: 700 and 600.
func checkPrivate(t *testing.T, root string) {
	t.Helper()
	dirs, files := 0, 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want, dirs = 0o700, dirs+1
		} else {
			files++
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %o, want %o", path, got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if dirs < 2 || files < 3 {
		t.Errorf("%s: %d directories and %d files: want a committed checkpoint (its shards and manifest)", root, dirs, files)
	}
}
