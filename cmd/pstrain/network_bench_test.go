package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/tools/netlab"
)

// TestBenchNetworkQuick runs `pstrain bench --sections network --quick
// --json`: the default cluster (chief, 2 PS, 2 workers, sync), each task
// in its own network namespace behind an emulated 100 Mbit/s link with
// 5 ms of delay and 0.1% loss, trains the MLP on a fifth of MNIST with
// --compress topk:0.01 to a held 90%. The JSON has the contract's keys,
// the run held its target and sent a fiftieth of the uncompressed bytes;
// a second bench on the same --work-dir takes the run from its journal.
//
// It needs root, `ip` and `tc` (iproute2) and /dev/net/tun, and a kernel
// that allows network namespaces; without the first three it skips,
// saying which (under CI=true, where scripts/setup.sh installs them, it
// fails), and it skips anywhere whose kernel refuses namespaces.
func TestBenchNetworkQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("trains a cluster across emulated links")
	}
	if err := netlab.Prereq(); err != nil {
		testbin.NeedOrSkip(t, err.Error())
	}
	if f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0); err != nil {
		testbin.NeedOrSkip(t, fmt.Sprintf("netlab's rate-limited links need /dev/net/tun: %v", err))
	} else {
		f.Close()
	}
	d, work := testbin.MNIST(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bench := func() (map[string]json.RawMessage, string) {
		cmd := exec.CommandContext(ctx, bin.Path(t), "bench", "--sections", "network", "--quick", "--json", "--data-dir", d, "--work-dir", work)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if strings.Contains(stderr.String(), netlab.ErrNetnsRefused.Error()) {
			t.Skip(stderr.String())
		}
		if err != nil {
			t.Fatalf("pstrain bench: %v\n%s\n%s", err, out, stderr.String())
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(out, &top); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return top, stderr.String()
	}
	top, progress := bench()
	t.Log(progress)
	var sec struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal(top["network"], &sec); err != nil || len(sec.Runs) != 1 {
		t.Fatalf("network section %s: %v", top["network"], err)
	}
	r := sec.Runs[0]
	for _, k := range []string{"link", "compress", "model", "time_to_target_seconds", "test_accuracy"} {
		if _, ok := r[k]; !ok {
			t.Errorf("network.runs[0] lacks %s: %v", k, r)
		}
	}
	if r["link"] != "100mbit" || r["compress"] != "topk:0.01" || r["model"] != "mlp" || r["stopped_by"] != "target" {
		t.Errorf("run %v, want mlp over 100mbit with topk:0.01 stopped by its target", r)
	}
	if ttt, ok := r["time_to_target_seconds"].(float64); !ok || ttt <= 0 {
		t.Errorf("time to target %v", r["time_to_target_seconds"])
	}
	if acc, _ := r["test_accuracy"].(float64); acc < 0.9 {
		t.Errorf("accuracy handed back %v, want >= 0.9 (the held target)", acc)
	}
	// top-k 1%: a value and an index per kept coordinate, 2% of the
	// model's 4 x 636010 bytes; pulls add a shard's first whole answer.
	const f32 = 4 * 636010
	if push, _ := r["push_bytes_per_step"].(float64); push <= 0 || push > 0.05*f32 {
		t.Errorf("push %v bytes per step, want (0, %v]", push, 0.05*f32)
	}
	if _, err := os.Stat(filepath.Join(work, "network-runs-quick.jsonl")); err != nil {
		t.Fatal(err)
	}
	again, progress := bench()
	if !strings.Contains(progress, "from the journal") || string(again["network"]) != string(top["network"]) {
		t.Errorf("second bench did not take the run from the journal:\n%s\n%s", progress, again["network"])
	}
}
