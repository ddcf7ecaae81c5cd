package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
)

func TestBenchRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--sections", "compute,gpu"},
		{"--batches", "0"},
		{"--duration", "-1s"},
		{"--predict", "workers=0,ps=1,net=1gbit"},
		{"--predict", "workers=2,ps=1,net=fast"},
		{"extra"},
	} {
		var out, errOut strings.Builder
		err := cmdBench(context.Background(), args, &out, &errOut)
		if !errors.Is(err, errUsage) {
			t.Errorf("bench %q: err = %v, want a usage error", args, err)
		}
	}
}

func TestBenchPredict(t *testing.T) {
	var out strings.Builder
	if err := cmdBench(context.Background(), []string{"--predict", "workers=32,ps=4,net=10gbit"}, &out, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "32 workers, 4 PS") || !strings.Contains(out.String(), "bound by the ps link") {
		t.Errorf("prediction:\n%s", out.String())
	}

	// Calibrated from a bench --json output.
	cal := filepath.Join(t.TempDir(), "bench.json")
	b := `{"wire":{"payload_bytes":1000000,"ms_per_round_trip":2,"update_ms":0.1},"ps_overhead":{"batch":100,"ps_compute_ms_per_step":10}}`
	if err := os.WriteFile(cal, []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := cmdBench(context.Background(), []string{"--predict", "workers=1,ps=1,net=8gbit,latency=0s", "--calibration", cal, "--json"}, &out, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Prediction struct {
			StepSeconds float64 `json:"step_seconds"`
		} `json:"prediction"`
	}
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	// 10 ms compute + 2 x max(1 ms software, 1 ms link) + 0.1 ms update.
	if d := got.Prediction.StepSeconds - 0.0121; d > 1e-9 || d < -1e-9 {
		t.Errorf("step = %v s, want 0.0121", got.Prediction.StepSeconds)
	}
}

// TestBenchMemoryJSON runs `pstrain bench --sections memory --json` for
// real: one default cluster run (2 PS, 2 workers, to the target), whose
// report gives every role's peak RSS. It checks the JSON's shape and that
// the figures come from that run, not how large they are.
func TestBenchMemoryJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster")
	}
	d := testbin.MNIST(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.Path(t), "bench", "--sections", "memory", "--json", "--data-dir", d, "--work-dir", t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("pstrain bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	type role struct {
		Tasks        *int   `json:"tasks"`
		PeakRSSBytes *int64 `json:"peak_rss_bytes"`
		GoalBytes    int64  `json:"goal_bytes"`
		MeetsGoal    *bool  `json:"meets_goal"`
	}
	var got struct {
		Compute *json.RawMessage `json:"compute"`
		Memory  *struct {
			Roles struct { // memory.roles.{ps,worker,chief} (the architecture's contract)
				Worker, Chief, PS role
			} `json:"roles"`
			Shards            []json.RawMessage `json:"shards"`
			TotalPeakRSSBytes int64             `json:"total_peak_rss_bytes"`
		} `json:"memory"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, stdout.String())
	}
	m := got.Memory
	if m == nil || got.Compute != nil {
		t.Fatalf("want the memory section alone: %s", stdout.String())
	}
	sum := int64(0)
	roles := m.Roles
	for name, r := range map[string]role{"worker": roles.Worker, "chief": roles.Chief, "ps": roles.PS} {
		if r.Tasks == nil || r.PeakRSSBytes == nil || r.MeetsGoal == nil {
			t.Fatalf("memory.roles.%s lacks tasks, peak_rss_bytes or meets_goal: %s", name, stdout.String())
		}
		if *r.PeakRSSBytes <= 0 {
			t.Errorf("memory.roles.%s.peak_rss_bytes = %d", name, *r.PeakRSSBytes)
		}
		sum += int64(*r.Tasks) * *r.PeakRSSBytes
		t.Logf("%s: %d task(s), peak RSS %.1f MiB (goal met: %v)", name, *r.Tasks, float64(*r.PeakRSSBytes)/(1<<20), *r.MeetsGoal)
	}
	if *roles.Worker.Tasks != 2 || *roles.Chief.Tasks != 1 || *roles.PS.Tasks != 2 || len(m.Shards) != 2 {
		t.Errorf("tasks: %d workers, %d chief, %d PS, %d shards; want the default cluster's 2, 1, 2, 2",
			*roles.Worker.Tasks, *roles.Chief.Tasks, *roles.PS.Tasks, len(m.Shards))
	}
	if roles.Worker.GoalBytes != 120<<20 || roles.Chief.GoalBytes != 120<<20 {
		t.Errorf("goals: worker %d, chief %d; want 120 MiB", roles.Worker.GoalBytes, roles.Chief.GoalBytes)
	}
	// The total is over every task; each role's peak is its largest task's.
	if m.TotalPeakRSSBytes <= 0 || m.TotalPeakRSSBytes > sum {
		t.Errorf("total_peak_rss_bytes = %d, want in (0, %d]", m.TotalPeakRSSBytes, sum)
	}
}

// TestBenchTLSJSON runs `pstrain bench --sections tls --quick --rounds 1
// --json` for real: one pair of default-cluster runs with and without
// --tls-dir, and (as root with `ip`) one pair across a netlab link, or
// the reason it was skipped. It checks the JSON's shape and that every
// figure comes from a run that trained, not how large the ratios are.
func TestBenchTLSJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs clusters")
	}
	d := testbin.MNIST(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.Path(t), "bench", "--sections", "tls", "--quick", "--rounds", "1", "--json",
		"--data-dir", d, "--work-dir", t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("pstrain bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	type pair struct {
		Plain    float64 `json:"plain_samples_per_second"`
		TLS      float64 `json:"tls_samples_per_second"`
		Ratio    float64 `json:"ratio"`
		CPURatio float64 `json:"cpu_ratio"`
		// The link's integrity-only run (--data-plane-privacy integrity).
		IntegrityRatio float64 `json:"integrity_ratio"`
	}
	var got struct {
		TLS *struct {
			SameHostRatio *float64 `json:"same_host_ratio"` // tls.same_host_ratio (the architecture's contract)
			SameHostRuns  []pair   `json:"same_host_runs"`
			LinkRatio     *float64 `json:"link_ratio"` // tls.link_ratio
			LinkSkipped   string   `json:"link_skipped"`
			LinkRuns      []pair   `json:"link_runs"`
			// tls.integrity_link_ratio
			IntegrityLinkRatio *float64 `json:"integrity_link_ratio"`
		} `json:"tls"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, stdout.String())
	}
	x := got.TLS
	if x == nil || x.SameHostRatio == nil || len(x.SameHostRuns) != 1 {
		t.Fatalf("want tls.same_host_ratio from one pair: %s", stdout.String())
	}
	runs := x.SameHostRuns
	switch {
	case x.LinkRatio != nil:
		if len(x.LinkRuns) != 1 || *x.LinkRatio != x.LinkRuns[0].Ratio {
			t.Fatalf("tls.link_ratio %v does not come from its one pair: %s", *x.LinkRatio, stdout.String())
		}
		if x.IntegrityLinkRatio == nil || *x.IntegrityLinkRatio <= 0 || *x.IntegrityLinkRatio != x.LinkRuns[0].IntegrityRatio {
			t.Fatalf("tls.integrity_link_ratio %v does not come from the link's integrity-only run: %s", x.IntegrityLinkRatio, stdout.String())
		}
		runs = append(runs, x.LinkRuns...)
	case x.LinkSkipped == "":
		t.Fatalf("tls.link_ratio is null with no reason: %s", stdout.String())
	default:
		t.Logf("link skipped: %s", x.LinkSkipped)
	}
	for _, p := range runs {
		if p.Plain <= 0 || p.TLS <= 0 || p.CPURatio <= 0 || p.Ratio != p.TLS/p.Plain {
			t.Fatalf("a pair without both runs' figures: %+v in %s", p, stdout.String())
		}
	}
	if *x.SameHostRatio != runs[0].Ratio {
		t.Fatalf("tls.same_host_ratio %v is not its one pair's %v", *x.SameHostRatio, runs[0].Ratio)
	}
}
