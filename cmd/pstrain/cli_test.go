package main

// The command line: help output (golden files), usage errors and exit
// statuses, the way Go's own tools behave.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/task"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// helpOf runs `pstrain ARGS` in-process and wants help on stdout only.
func helpOf(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, &stdout, &stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("pstrain %q: %v", args, err)
	}
	if stderr.Len() > 0 || stdout.Len() == 0 {
		t.Fatalf("pstrain %q: stdout %d bytes, stderr %q; want the help on stdout", args, stdout.Len(), stderr.String())
	}
	return stdout.String()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./cmd/pstrain -run TestHelpGolden -update writes it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the output (go test ./cmd/pstrain -run TestHelpGolden -update rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func TestHelpGolden(t *testing.T) {
	for _, c := range []struct {
		golden string
		args   []string
	}{
		{"help.golden", []string{"-h"}},
		{"run-help.golden", []string{"run", "-h"}},
	} {
		checkGolden(t, c.golden, helpOf(t, c.args...))
	}
	// The same text however help is asked for.
	top := helpOf(t, "-h")
	for _, args := range [][]string{{"--help"}, {"-help"}, {"help"}} {
		if got := helpOf(t, args...); got != top {
			t.Errorf("pstrain %q differs from pstrain -h", args)
		}
	}
	runHelp := helpOf(t, "run", "-h")
	for _, args := range [][]string{{"run", "--help"}, {"help", "run"}} {
		if got := helpOf(t, args...); got != runHelp {
			t.Errorf("pstrain %q differs from pstrain run -h", args)
		}
	}
}

// labCommands are run by pstrain-lab; its own tests check their help.
var labCommands = map[string]bool{"sweep": true, "plot": true}

// helpCommands is every command and subcommand that has its own help.
func helpCommands() [][]string {
	var out [][]string
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		switch {
		case labCommands[name]:
			continue
		case name == "data":
			out = append(out, []string{"data", "fetch"}, []string{"data", "synth-ctr"})
		case name == "checkpoint":
			out = append(out, []string{"checkpoint"}, []string{"checkpoint", "ls"}, []string{"checkpoint", "verify"}, []string{"checkpoint", "inspect"})
		default:
			out = append(out, []string{name})
		}
	}
	return append(out, []string{"version"})
}

// Every command's -h (on stdout) lists each flag once, with a type or an
// argument name after it (no backquoted words taken for value names) and
// at most one default.
func TestCommandHelpFlags(t *testing.T) {
	for _, cmd := range helpCommands() {
		out := helpOf(t, append(cmd, "-h")...)
		name := strings.Join(cmd, " ")
		if !strings.HasPrefix(out, "usage:") {
			t.Errorf("pstrain %s -h does not start with usage:\n%s", name, out)
		}
		if strings.Contains(out, "`") {
			t.Errorf("pstrain %s -h has a backquote:\n%s", name, out)
		}
		for _, l := range testbin.BadFlagLines(out) {
			t.Errorf("pstrain %s -h: %q: a usage string's backquotes named the value", name, l)
		}
		seen := map[string]bool{}
		for _, f := range testbin.FlagNames(out) {
			if seen[f] {
				t.Errorf("pstrain %s -h lists -%s twice", name, f)
			}
			seen[f] = true
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Count(line, "(default") > 1 {
				t.Errorf("pstrain %s -h: default given twice: %s", name, strings.TrimSpace(line))
			}
		}
	}
	// The run flags of the golden file, once each.
	out := helpOf(t, "run", "-h")
	for _, f := range []string{"hidden", "mode", "lr", "workers", "ps", "tls-dir", "fault"} {
		if n := len(regexp.MustCompile(`(?m)^  -`+f+`( |$)`).FindAllString(out, -1)); n != 1 {
			t.Errorf("pstrain run -h lists -%s %d times", f, n)
		}
	}
	for _, want := range []string{"comma list of hidden (dense) layer sizes (--model cnn: 256, --model ctr: 128,64 unless given) (default 800)\n", `SGD mode: sync, async or ssp (default "sync")` + "\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("pstrain run -h does not say %q", want)
		}
	}
	if out := helpOf(t, "ps", "-h"); !strings.Contains(out, "this task's index (-1: from TF_CONFIG or the cluster file's task) (default -1)\n") {
		t.Errorf("pstrain ps -h: -index:\n%s", out)
	}
}

// A command-line mistake is a usage error: main prints it and one hint line.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args      []string
		msg, hint string
	}{
		{[]string{"version", "extra"}, `pstrain version: unexpected argument "extra"`, "run 'pstrain version -h' for usage"},
		{[]string{"checkpoint", "verify", "--all"}, `pstrain checkpoint: unknown flag "--all"`, "run 'pstrain checkpoint -h' for usage"},
		{[]string{"bogus"}, `pstrain: unknown command "bogus"`, "run 'pstrain -h' for usage"},
		{[]string{"--bogus"}, `pstrain: unknown flag "--bogus"`, "run 'pstrain -h' for usage"},
		{[]string{"run", "--bogus"}, "pstrain run: flag provided but not defined: -bogus", "run 'pstrain run -h' for usage"},
		{[]string{"run", "--batch", "x"}, `pstrain run: invalid value "x" for flag -batch`, "run 'pstrain run -h' for usage"},
		{[]string{"run", "--mode", "bsp"}, "pstrain run: --mode must be sync, async or ssp", "run 'pstrain run -h' for usage"},
		{[]string{"run", "extra"}, `pstrain run: unexpected argument "extra"`, "run 'pstrain run -h' for usage"},
		{[]string{"ps", "--index", "x"}, `pstrain ps: invalid value "x" for flag -index`, "run 'pstrain ps -h' for usage"},
		{[]string{"data"}, "pstrain data: missing subcommand: fetch or synth-ctr", "run 'pstrain data -h' for usage"},
		{[]string{"data", "fetch", "--nope"}, "pstrain data fetch: flag provided but not defined: -nope", "run 'pstrain data fetch -h' for usage"},
		{[]string{"checkpoint", "ls"}, "pstrain checkpoint: ls takes one directory", "run 'pstrain checkpoint -h' for usage"},
		{[]string{"checkpoint", "rm", "x"}, `pstrain checkpoint: unknown subcommand "rm"`, "run 'pstrain checkpoint -h' for usage"},
		{[]string{"eval"}, "pstrain eval: missing --checkpoint DIR", "run 'pstrain eval -h' for usage"},
		{[]string{"top", "--interval", "0s"}, "pstrain top: --interval must be positive", "run 'pstrain top -h' for usage"},
		{[]string{"certs"}, "pstrain certs: missing --out DIR", "run 'pstrain certs -h' for usage"},
		{[]string{"bench", "--batches", "0"}, "pstrain bench: --batches", "run 'pstrain bench -h' for usage"},
		{[]string{"scale", "--workers", "0"}, "pstrain scale: --workers must be at least 1, got 0", "run 'pstrain scale -h' for usage"},
		{[]string{"scale", "--ps", "0"}, "pstrain scale: --ps must be at least 1, got 0", "run 'pstrain scale -h' for usage"},
		{[]string{"scale", "--ps", "0", "--workers", "2"}, "pstrain scale: --workers, --ps and --rebalance: one change at a time", "run 'pstrain scale -h' for usage"},
		{[]string{"scale", "--rebalance=false"}, "pstrain scale: say what to change", "run 'pstrain scale -h' for usage"},
		{[]string{"scale"}, "pstrain scale: say what to change", "run 'pstrain scale -h' for usage"},
	} {
		var stdout, stderr, msg bytes.Buffer
		err := run(context.Background(), c.args, &stdout, &stderr)
		if !errors.Is(err, errUsage) {
			t.Errorf("pstrain %q: err = %v, want a usage error", c.args, err)
			continue
		}
		if stdout.Len()+stderr.Len() > 0 {
			t.Errorf("pstrain %q printed %q %q besides the error", c.args, stdout.String(), stderr.String())
		}
		printUsageError(&msg, err)
		lines := strings.Split(strings.TrimSuffix(msg.String(), "\n"), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], c.msg) || lines[1] != c.hint {
			t.Errorf("pstrain %q printed\n%s\nwant %q... and %q", c.args, msg.String(), c.msg, c.hint)
		}
	}
}

// The binary's exit statuses: 0 for help and version, 2 for a bad value
// the user gave (on the command line, in TF_CONFIG or in a cluster file;
// with a short message on stderr), 1 for a failure.
func TestExitCodes(t *testing.T) {
	exe := bin.Path(t)
	tf := func(ps, task string) string {
		return `{"cluster":{"chief":["127.0.0.1:1"],"ps":["` + ps + `"],"worker":["127.0.0.1:3"]},"task":` + task + `}`
	}
	for _, c := range []struct {
		args       []string
		code       int
		stdout     string // a substring of stdout
		stderrHint string // the last line of stderr ("" = stderr empty)
		tfConfig   string // TF_CONFIG ("" = unset)
	}{
		{[]string{"--version"}, 0, "pstrain " + task.Version + "\n", "", ""},
		{[]string{"-version"}, 0, "pstrain " + task.Version + "\n", "", ""},
		{[]string{"version"}, 0, "pstrain " + task.Version + "\n", "", ""},
		{[]string{"-h"}, 0, "Usage:\n  pstrain run [flags]", "", ""},
		{[]string{"--help"}, 0, "Usage:\n  pstrain run [flags]", "", ""},
		{[]string{"help"}, 0, "Usage:\n  pstrain run [flags]", "", ""},
		{[]string{"run", "-h"}, 0, "usage: pstrain run [flags]", "", ""},
		{[]string{"ps", "--help"}, 0, "usage: pstrain ps [flags]", "", ""},
		{[]string{"bogus"}, 2, "", "run 'pstrain -h' for usage", ""},
		{[]string{"run", "--frobnicate"}, 2, "", "run 'pstrain run -h' for usage", ""},
		{[]string{"run", "--ps", "zero"}, 2, "", "run 'pstrain run -h' for usage", ""},
		{[]string{"run", "--ps", "0"}, 2, "", "run 'pstrain run -h' for usage", ""},
		{[]string{"checkpoint", "ls", filepath.Join(t.TempDir(), "none")}, 1, "", "is not a directory", ""},
		{[]string{"task"}, 2, "", "run 'pstrain task -h' for usage", "garbage"},
		{[]string{"task"}, 2, "", "run 'pstrain task -h' for usage", tf("127.0.0.1:2", `{"type":"bogus","index":0}`)},
		{[]string{"task"}, 2, "", "run 'pstrain task -h' for usage", tf("127.0.0.1:2", `{"type":"worker","index":7}`)},
		{[]string{"task"}, 2, "", "run 'pstrain task -h' for usage", tf("127.0.0.1:x", `{"type":"worker","index":0}`)},
		{[]string{"task"}, 2, "", "run 'pstrain task -h' for usage", tf("127.0.0.1:1", `{"type":"worker","index":0}`)},
		{[]string{"worker", "--index", "3"}, 2, "", "run 'pstrain worker -h' for usage", tf("127.0.0.1:2", `{"type":"worker","index":0}`)},
		{[]string{"worker", "--cluster", filepath.Join(t.TempDir(), "none.json")}, 1, "", "no such file", ""},
		{[]string{"scale", "--workers", "0"}, 2, "", "run 'pstrain scale -h' for usage", ""},
		{[]string{"scale", "--run-dir", t.TempDir(), "--workers", "2"}, 1, "", "no pstrain run is running there", ""},
		// No pstrain-lab beside this build: how to build it.
		{[]string{"sweep", "--grid", "mode=sync"}, 1, "", "build both with 'make build'", ""},
	} {
		cmd := exec.Command(exe, c.args...)
		if c.tfConfig != "" {
			cmd.Env = append(os.Environ(), "TF_CONFIG="+c.tfConfig)
		}
		code, stdout, stderr := testbin.Run(t, cmd)
		if code != c.code {
			t.Errorf("pstrain %q: exit status %d, want %d\nstdout %q\nstderr %q", c.args, code, c.code, stdout, stderr)
		}
		if !strings.Contains(stdout, c.stdout) {
			t.Errorf("pstrain %q: stdout %q, want it to contain %q", c.args, stdout, c.stdout)
		}
		switch lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n"); {
		case c.stderrHint == "" && stderr != "":
			t.Errorf("pstrain %q: stderr %q, want none", c.args, stderr)
		case c.code == 2 && (len(lines) != 2 || lines[1] != c.stderrHint):
			t.Errorf("pstrain %q: stderr %q, want the error and %q", c.args, stderr, c.stderrHint)
		case c.code == 1 && !strings.Contains(stderr, c.stderrHint):
			t.Errorf("pstrain %q: stderr %q, want %q", c.args, stderr, c.stderrHint)
		}
	}
}

// `pstrain` alone is a usage error: the whole usage on stderr, status 2
// (as `go` alone does).
func TestNoCommandPrintsUsage(t *testing.T) {
	code, stdout, stderr := testbin.Run(t, exec.Command(bin.Path(t)))
	if code != 2 {
		t.Fatalf("pstrain alone: exit status %d, want 2", code)
	}
	if stdout != "" || stderr != usage {
		t.Errorf("pstrain alone: stdout %q, stderr %q; want the usage on stderr only", stdout, stderr)
	}
}

// Every command and subcommand takes an unknown flag for a usage error: a
// short message naming the command and a hint, nothing else printed.
func TestEveryCommandUsageError(t *testing.T) {
	hint := regexp.MustCompile(`^run 'pstrain [a-z]+( [a-z-]+)? -h' for usage$`)
	for _, cmd := range helpCommands() {
		args := append(slices.Clone(cmd), "--no-such-flag")
		var stdout, stderr, msg bytes.Buffer
		err := run(context.Background(), args, &stdout, &stderr)
		if !errors.Is(err, errUsage) {
			t.Errorf("pstrain %q: err = %v, want a usage error", args, err)
			continue
		}
		if stdout.Len()+stderr.Len() > 0 {
			t.Errorf("pstrain %q printed %q %q besides the error", args, stdout.String(), stderr.String())
		}
		printUsageError(&msg, err)
		lines := strings.Split(strings.TrimSuffix(msg.String(), "\n"), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "pstrain "+cmd[0]) || !strings.Contains(lines[0], "no-such-flag") || !hint.MatchString(lines[1]) {
			t.Errorf("pstrain %q printed\n%s\nwant the command, the flag and a hint", args, msg.String())
		}
	}
}

// The integrity-only data plane takes its keys from the TLS handshake:
// without TLS it is refused as a usage error, not run in plaintext.
func TestIntegrityWithoutTLSIsAUsageError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"run", "--data-plane-privacy", "integrity", "--dry-run"}, &stdout, &stderr)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--tls-dir") {
		t.Fatalf("err = %v, want a usage error naming --tls-dir", err)
	}
	if err := run(context.Background(), []string{"run", "--data-plane-privacy", "integrity", "--tls-dir", t.TempDir(), "--dry-run"}, &stdout, &stderr); err != nil {
		t.Fatalf("with --tls-dir: %v", err)
	}
}
