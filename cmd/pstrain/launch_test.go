package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

// TestLaunchScriptBehavesLikeRun runs scripts/launch.sh on a cluster file
// of this host: like `pstrain run`, the run writes checkpoints and the
// report, and the chief's summary reaches the terminal (stdout).
func TestLaunchScriptBehavesLikeRun(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	p := freeTaskPorts(t, 3)
	cf := filepath.Join(tmp, "cluster.json")
	if err := os.WriteFile(cf, fmt.Appendf(nil, `{"chief":["127.0.0.1:%d"],"ps":["127.0.0.1:%d"],"worker":["127.0.0.1:%d"]}`, p[0], p[1], p[2]), 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tmp, "launch")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "launch.sh"), cf, "--",
		"--data-dir", d, "--data-fraction", "0.1", "--epochs", "1", "--target-accuracy", "0", "--checkpoint-every", "20")
	cmd.Env = append(os.Environ(), "PSTRAIN_BIN="+bin.Path(t), "LAUNCH_DIR="+dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("launch.sh: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"== pstrain summary ==", "stopped by: epochs", "checkpoints: "} {
		if !strings.Contains(out, want) {
			t.Errorf("launch.sh printed no %q on stdout:\n%s\nstderr:\n%s", want, out, stderr.String())
		}
	}
	rep, err := report.Read(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	infos, err := checkpoint.NewStore(checkpoint.OSFS{}, filepath.Join(dir, "checkpoints"), 0).List()
	if err != nil || len(infos) == 0 || rep.Checkpoints.Committed == 0 {
		t.Fatalf("checkpoints in %s: %v, %v; report says %d committed", filepath.Join(dir, "checkpoints"), infos, err, rep.Checkpoints.Committed)
	}
	// The newest is the final checkpoint, of the last step's model (its
	// directory is named by the newest shard version: docs/recovery.md,
	// "The final checkpoint").
	if m := infos[0].Manifest; m == nil || !m.Final || m.Version != rep.GlobalSteps {
		t.Errorf("newest checkpoint %+v: want the final one, of the model of step %d", infos[0], rep.GlobalSteps)
	}
}
