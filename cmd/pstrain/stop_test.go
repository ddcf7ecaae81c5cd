package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

// evalCheckpoint scores a checkpoint with `pstrain eval` and returns the
// accuracy it printed (in [0,1], to 1e-4) and the manifest's version.
func evalCheckpoint(t *testing.T, ctx context.Context, dir, data string) (acc float64, version int64) {
	t.Helper()
	out, err := pstrain(t, ctx, "eval", "--checkpoint", dir, "--data-dir", data)
	if err != nil {
		t.Fatalf("pstrain eval: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`version (\d+),[\s\S]*test accuracy ([0-9.]+)%`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no accuracy in pstrain eval's output:\n%s", out)
	}
	version, _ = strconv.ParseInt(m[1], 10, 64)
	pct, _ := strconv.ParseFloat(m[2], 64)
	return pct / 100, version
}

// newestCheckpoint is the final checkpoint of a run's checkpoint dir.
func newestCheckpoint(t *testing.T, dir string) checkpoint.Info {
	t.Helper()
	info, _, err := checkpoint.NewStore(checkpoint.OSFS{}, dir, 0).Latest()
	if err != nil {
		t.Fatal(err)
	}
	ck, err := checkpoint.NewStore(checkpoint.OSFS{}, dir, 0).Load(info.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !ck.Manifest.Final {
		t.Errorf("the newest checkpoint %s is not the final one", info.Path)
	}
	return info
}

// A run stopped by the target hands back the model that met it: the
// final checkpoint scores what the report says, at or above the target,
// in sync and async mode, although training went on while the chief
// evaluated.
func TestTargetStopHandsBackTheScoredModel(t *testing.T) {
	d := testbin.MNIST(t)
	for _, mode := range []string{"sync", "async"} {
		lr := map[string]string{"sync": "0.2", "async": "0.05"}[mode] // async diverges at 0.2 with momentum 0.9
		t.Run(mode, func(t *testing.T) {
			tmp := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rp, ckdir := filepath.Join(tmp, "report.json"), filepath.Join(tmp, "ckpt")
			out, err := pstrain(t, ctx, "run", "--mode", mode, "--lr", lr, "--data-dir", d, "--data-fraction", "0.25", "--epochs", "10",
				"--target-accuracy", "0.93", "--target-hold", "2", "--eval-every", "300ms", "--checkpoint-dir", ckdir,
				"--run-dir", filepath.Join(tmp, "run"), "--sd-dir", filepath.Join(tmp, "targets"), "--report", rp)
			if err != nil {
				t.Fatalf("pstrain run: %v\n%s", err, out)
			}
			rep, err := report.Read(rp)
			if err != nil {
				t.Fatal(err)
			}
			if rep.StoppedBy != "target" {
				t.Fatalf("stopped by %q, want target\n%s", rep.StoppedBy, out)
			}
			acc, version := evalCheckpoint(t, ctx, newestCheckpoint(t, ckdir).Path, d)
			if math.Abs(acc-rep.TestAccuracy) > 1e-4+1e-9 || acc < 0.93 {
				t.Errorf("pstrain eval of the final checkpoint: %.4f; report: %.4f; target 0.93", acc, rep.TestAccuracy)
			}
			if rep.FinalStep > rep.GlobalSteps || (mode == "sync" && version != rep.FinalStep) {
				t.Errorf("final step %d, checkpoint version %d, global steps %d", rep.FinalStep, version, rep.GlobalSteps)
			}
			last := rep.Evals[len(rep.Evals)-1]
			if last.Subset || last.Step != rep.FinalStep || last.TestAccuracy != rep.TestAccuracy || rep.TimeToTargetSeconds == nil {
				t.Errorf("the last evaluation %+v is not the handed-back model's (final step %d, accuracy %.4f)", last, rep.FinalStep, rep.TestAccuracy)
			}
			if n := len(rep.Evals); n < 2 || rep.Evals[n-2].TestAccuracy < 0.93 {
				t.Errorf("the target was not held for 2 evaluations: %+v", rep.Evals)
			}
			want := fmt.Sprintf("test accuracy: %.2f%% (the model of step %d;", 100*rep.TestAccuracy, rep.FinalStep)
			if !strings.Contains(out, want) {
				t.Errorf("summary lacks %q:\n%s", want, out)
			}
		})
	}
}

// Ctrl-C on `pstrain run` stops the run cleanly: exit status 130, the
// summary and report say interrupted, and the final checkpoint holds the
// model the report scored.
func TestInterruptStopsTheRunCleanly(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rp, ckdir := filepath.Join(tmp, "report.json"), filepath.Join(tmp, "ckpt")
	cmd := exec.CommandContext(ctx, bin.Path(t), "run", "--data-dir", d, "--epochs", "20", "--target-accuracy", "0",
		"--eval-every", "500ms", "--checkpoint-dir", ckdir, "--checkpoint-every", "1s",
		"--run-dir", filepath.Join(tmp, "run"), "--sd-dir", filepath.Join(tmp, "targets"), "--report", rp)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Interrupt once training is under way (a progress line past step 0).
	sc := bufio.NewScanner(stdout)
	moving := regexp.MustCompile(`^step +[1-9]`)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if moving.MatchString(sc.Text()) {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stdout)
	out.Write(rest)
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Fatalf("pstrain run after SIGINT: %v, want exit status 130\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "stopped by: interrupted") {
		t.Errorf("no summary saying interrupted:\n%s", out.String())
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StoppedBy != "interrupted" || rep.GlobalSteps <= 0 || rep.Checkpoints.Committed < 1 {
		t.Errorf("report: stopped by %q after %d steps, checkpoints %+v", rep.StoppedBy, rep.GlobalSteps, rep.Checkpoints)
	}
	final := newestCheckpoint(t, ckdir)
	if vout, err := pstrain(t, ctx, "checkpoint", "verify", ckdir); err != nil {
		t.Errorf("checkpoint verify %s: %v\n%s", ckdir, err, vout)
	}
	if acc, version := evalCheckpoint(t, ctx, final.Path, d); math.Abs(acc-rep.TestAccuracy) > 1e-4+1e-9 || version != rep.FinalStep {
		t.Errorf("final checkpoint: accuracy %.4f version %d; report: %.4f at step %d", acc, version, rep.TestAccuracy, rep.FinalStep)
	}
	for name, tk := range rep.Tasks {
		if name != "chief" && tk.ExitCode != 0 {
			t.Errorf("%s exited with %d after a clean stop", name, tk.ExitCode)
		}
	}
}

// A run whose checkpoints failed says so in its summary, with the last
// error's first line; one whose checkpoints were written says how many.
func TestSummaryShowsCheckpoints(t *testing.T) {
	var b strings.Builder
	printSummary(&b, &report.Report{Checkpoints: report.Checkpoints{Committed: 1, Failed: 8,
		LastError: "ps/0: no space left on device\nps/1: no space left on device"}})
	if !strings.Contains(b.String(), "checkpoints: 1 committed, 8 FAILED (last: ps/0: no space left on device)\n") {
		t.Errorf("summary:\n%s", b.String())
	}
	b.Reset()
	printSummary(&b, &report.Report{Checkpoints: report.Checkpoints{Committed: 3}})
	if !strings.Contains(b.String(), "checkpoints: 3 committed\n") || strings.Contains(b.String(), "FAILED") {
		t.Errorf("summary:\n%s", b.String())
	}
}
