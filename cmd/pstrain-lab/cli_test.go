package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os/exec"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/internal/testbin"
)

// Each command's help goes to stdout, names the program as it was called
// and has no backquoted words taken for value names.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"sweep", "-h"}, {"plot", "--help"}} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), "pstrain", args, &stdout, &stderr)
		if err != nil && !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%q: %v", args, err)
		}
		out := stdout.String()
		if stderr.Len() > 0 || !strings.Contains(out, "pstrain ") || strings.Contains(out, "`") {
			t.Errorf("%q: stdout %q stderr %q", args, out, stderr.String())
		}
		for _, l := range testbin.BadFlagLines(out) {
			t.Errorf("%q: %q: a usage string's backquotes named the value", args, l)
		}
	}
}

// A command-line mistake prints the error and one hint line, status 2.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "pstrain: no command given\nrun 'pstrain -h' for usage\n"},
		{[]string{"bogus"}, "pstrain: unknown command \"bogus\"\nrun 'pstrain -h' for usage\n"},
		{[]string{"sweep", "--grid", "mode=sync"}, "pstrain sweep: need --grid SPEC and --out DIR\nrun 'pstrain sweep -h' for usage\n"},
		{[]string{"sweep", "--grid", "mode=sync", "--out", "d", "--repeat", "0"}, "pstrain sweep: --repeat must be at least 1, got 0\nrun 'pstrain sweep -h' for usage\n"},
		{[]string{"plot"}, "pstrain plot: want one sweep directory, got 0 arguments\nrun 'pstrain plot -h' for usage\n"},
		{[]string{"plot", "--bogus"}, "pstrain plot: flag provided but not defined: -bogus\nrun 'pstrain plot -h' for usage\n"},
	} {
		var stdout, stderr, msg bytes.Buffer
		err := run(context.Background(), "pstrain", c.args, &stdout, &stderr)
		if code := exitCode(&msg, "pstrain", err, nil); code != 2 || msg.String() != c.want || stdout.Len()+stderr.Len() > 0 {
			t.Errorf("%q: status %d, printed %q (stdout %q), want 2 and %q", c.args, code, msg.String(), stdout.String(), c.want)
		}
	}
}

func TestExitCodeAfterSignal(t *testing.T) {
	var msg bytes.Buffer
	if code := exitCode(&msg, "pstrain", context.Canceled, signalCause{15}); code != 143 || !strings.Contains(msg.String(), "interrupted") {
		t.Errorf("after SIGTERM: %d %q", code, msg.String())
	}
	if code := exitCode(&msg, "pstrain", errors.New("boom"), nil); code != 1 {
		t.Errorf("a failure: %d", code)
	}
}

// Through the binaries as make build leaves them: pstrain sweep and plot
// run pstrain-lab, which speaks as pstrain; run directly, it is
// pstrain-lab.
func TestPstrainRunsTheLab(t *testing.T) {
	pstrain, lab := bins.paths(t)
	for _, c := range []struct {
		exe    string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{pstrain, []string{"sweep", "--grid", "mode=sync"}, 2, "", "pstrain sweep: need --grid SPEC and --out DIR\nrun 'pstrain sweep -h' for usage\n"},
		{pstrain, []string{"plot", "-h"}, 0, "usage: pstrain plot SWEEP_DIR", ""},
		{pstrain, []string{"sweep", "--grid", "workers=0", "--out", t.TempDir()}, 1, "", "pstrain run: --workers must be at least 1"},
		{lab, []string{"-h"}, 0, "pstrain-lab — experiment sweeps", ""},
		{lab, []string{"plot"}, 2, "", "pstrain-lab plot: want one sweep directory"},
	} {
		cmd := exec.Command(c.exe, c.args...)
		code, stdout, stderr := testbin.Run(t, cmd)
		if code != c.code || !strings.Contains(stdout, c.stdout) || !strings.Contains(stderr, c.stderr) || (c.stderr == "" && stderr != "") {
			t.Errorf("%s %q: status %d, stdout %q, stderr %q; want %d, %q, %q", c.exe, c.args, code, stdout, stderr, c.code, c.stdout, c.stderr)
		}
	}
}
