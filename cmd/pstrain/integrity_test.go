package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/transport/certs"
)

// `pstrain run --tls-dir --data-plane-privacy integrity` trains: the mode
// reaches every task (a bad value is refused before any starts).
func TestRunIntegrityOnlyTrains(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rp := filepath.Join(tmp, "report.json")
	out, err := pstrain(t, ctx, "run", "--tls-dir", filepath.Join(tmp, "tls"), "--data-plane-privacy", "integrity",
		"--data-dir", d, "--data-fraction", "0.1", "--epochs", "1", "--target-accuracy", "0", "--eval-every", "0s",
		"--run-dir", filepath.Join(tmp, "run"), "--sd-dir", "", "--report", rp)
	if err != nil {
		t.Fatalf("pstrain run --data-plane-privacy integrity: %v\n%s", err, out)
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	if rep.GlobalSteps == 0 || rep.TestAccuracy < 0.8 {
		t.Errorf("accuracy %.4f after %d steps, want >= 0.8", rep.TestAccuracy, rep.GlobalSteps)
	}
}

// A cluster by hand whose PS's data plane is named "localhost" (so no
// same-host socket: every pull and push crosses TCP) trains in the
// integrity-only mode: handshake, switch to tagged records, frames.
func TestByHandClusterIntegrityOverTCP(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	a := freeAddrs(t, 4)
	spec := cluster.Spec{Chief: a[:1], PS: a[1:2], Worker: a[2:3]}
	cf := filepath.Join(tmp, "cluster.json")
	if err := os.WriteFile(cf, spec.JSON(), 0o644); err != nil {
		t.Fatal(err)
	}
	tlsDir := filepath.Join(tmp, "tls")
	if _, err := certs.Generate(tlsDir, spec, nil, certs.Options{}, false); err != nil {
		t.Fatal(err)
	}
	dataAddr := "localhost:" + strings.Split(a[3], ":")[1]
	common := []string{"--cluster", cf, "--tls-dir", tlsDir, "--data-plane-privacy", "integrity", "--ps", "1", "--workers", "1",
		"--data-dir", d, "--data-fraction", "0.1", "--epochs", "1", "--target-accuracy", "0", "--eval-every", "0s",
		"--metrics-addr", "off", "--auth-token-file", tokenFile(t)}
	rp := filepath.Join(tmp, "r.json")
	c := startTask(t, nil, append([]string{"chief", "--report", rp}, common...)...)
	p := startTask(t, nil, append([]string{"ps", "--index", "0", "--data-addr", dataAddr}, common...)...)
	w := startTask(t, nil, append([]string{"worker", "--index", "0"}, common...)...)
	for name, pr := range map[string]*proc{"chief": c, "worker": w, "ps": p} {
		if err := pr.wait(t, 2*time.Minute); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, pr.out.String())
		}
	}
	if !strings.Contains(p.out.String(), fmt.Sprintf("addr=%s", dataAddr)) {
		t.Errorf("the PS's data plane is not at %s:\n%s", dataAddr, p.out.String())
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	if rep.GlobalSteps == 0 || rep.TestAccuracy < 0.8 {
		t.Errorf("accuracy %.4f after %d steps, want >= 0.8", rep.TestAccuracy, rep.GlobalSteps)
	}
}
