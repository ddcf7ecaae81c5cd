package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/internal/testbin"
)

// pstrain sweep and plot run the lab binary found beside pstrain, under
// pstrain's name; without it they say how to build it.
func TestExecLab(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "pstrain")
	var gotPath string
	var gotArgv []string
	fake := func(path string, argv, _ []string) error {
		gotPath, gotArgv = path, argv
		return nil
	}
	err := execLab(self, "sweep", []string{"--grid", "mode=sync"}, fake)
	if err == nil || !strings.Contains(err.Error(), "make build") || !strings.Contains(err.Error(), filepath.Join(dir, labBinary)) || gotPath != "" {
		t.Errorf("without the lab: %v (ran %q)", err, gotPath)
	}
	lab := filepath.Join(dir, labBinary)
	if err := os.WriteFile(lab, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := execLab(self, "sweep", []string{"--grid", "mode=sync"}, fake); err != nil {
		t.Fatal(err)
	}
	if want := []string{"pstrain", "sweep", "--grid", "mode=sync"}; gotPath != lab || !reflect.DeepEqual(gotArgv, want) {
		t.Errorf("ran %s %q, want %s %q", gotPath, gotArgv, lab, want)
	}
	failed := errors.New("exec format error")
	if err := execLab(self, "plot", nil, func(string, []string, []string) error { return failed }); !errors.Is(err, failed) {
		t.Errorf("a failed exec: %v", err)
	}
}

// --dry-run prints the resolved run flags, which a run reads back, and
// refuses what a run refuses.
func TestRunDryRun(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"run", "--dry-run", "--workers=3", "--model=cnn"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	back := parseRunFlags(t, lines...)
	if back.Workers != 3 || back.Model.String() != "cnn" || stderr.Len() > 0 {
		t.Errorf("dry run printed %q (stderr %q)", stdout.String(), stderr.String())
	}
	if err := run(context.Background(), []string{"run", "--dry-run", "--workers=0"}, &stdout, &stderr); !errors.Is(err, errUsage) {
		t.Errorf("--workers=0: %v, want a usage error", err)
	}
}

// The training binary links neither the lab nor the plotting libraries:
// they are pstrain-lab's.
func TestTrainingBinaryLinksNoLab(t *testing.T) {
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-deps", "./cmd/pstrain")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/pstrain/pstrain/launcher") {
		t.Fatalf("go list -deps ./cmd/pstrain does not list the launcher: %q", deps)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "gonum.org/v1/plot") || strings.HasPrefix(d, "github.com/pstrain/pstrain/lab/") {
			t.Errorf("cmd/pstrain depends on %s", d)
		}
	}
}
