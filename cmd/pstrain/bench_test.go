package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
