package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/cluster"
)

// `pstrain run --ps-replicas 1` starts standby/N beside every ps/N: 7
// processes for 2 shards and 2 workers, the standbys in the cluster file
// and the Prometheus targets, each listening on its own gRPC, data-plane
// and metrics ports, each registering with the chief as standby/N and
// taking its primary's snapshot. (TestHotStandbysLoseNothing kills the
// primaries.)
func TestRunStartsStandbys(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := startRun(t, ctx, tmp, "--ps-replicas", "1", "--ps", "2", "--workers", "2", "--hidden", "32", "--batch", "64",
		"--data-fraction", "0.05", "--epochs", "1000000", "--checkpoint-dir", "", "--max-restarts", "100")

	// The cluster file lists a standby per shard, on addresses of its own.
	var spec cluster.Spec
	waitFor(t, r, 30*time.Second, "the cluster file", func() bool {
		b, err := os.ReadFile(filepath.Join(r.dir, "cluster.json"))
		return err == nil && json.Unmarshal(b, &spec) == nil
	})
	if err := spec.Validate(); err != nil || len(spec.Standby) != 2 || len(spec.PS) != 2 {
		t.Fatalf("cluster file: %+v (%v), want 2 ps and 2 standbys", spec, err)
	}

	// All 7 processes are up: the targets file lists them, the standbys
	// with their own role.
	type target struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var targets []target
	waitFor(t, r, 30*time.Second, "7 targets", func() bool {
		b, err := os.ReadFile(filepath.Join(tmp, "targets", "pstrain.json"))
		return err == nil && json.Unmarshal(b, &targets) == nil && len(targets) == 7
	})
	roles := map[string]string{}
	ports := map[string]string{}
	for _, g := range targets {
		roles[g.Labels["task"]] = g.Labels["role"]
		for _, a := range g.Targets {
			if other, dup := ports[a]; dup {
				t.Errorf("%s and %s share the metrics address %s", other, g.Labels["task"], a)
			}
			ports[a] = g.Labels["task"]
		}
	}
	for _, want := range []string{"chief", "ps/0", "ps/1", "worker/0", "worker/1", "standby/0", "standby/1"} {
		role, _, _ := strings.Cut(want, "/")
		if roles[want] != role {
			t.Errorf("targets: %s has role %q, want %q (all: %v)", want, roles[want], role, roles)
		}
	}

	for i, addr := range spec.Standby {
		task := fmt.Sprintf("standby/%d", i)
		// Its process runs `pstrain standby --index=i` (its pid file
		// names it; a standby the chief refuses is between restarts at
		// times, hence the wait) ...
		var args []string
		waitFor(t, r, 30*time.Second, task+"'s pid file", func() bool {
			b, err := os.ReadFile(filepath.Join(r.dir, "pids", fmt.Sprintf("standby-%d.pid", i)))
			var rec struct {
				PID  int      `json:"pid"`
				Args []string `json:"cmdline"`
			}
			if err != nil || json.Unmarshal(b, &rec) != nil || rec.PID <= 0 {
				return false
			}
			args = rec.Args
			return true
		})
		if len(args) < 2 || args[1] != "standby" || !slices.Contains(args, fmt.Sprintf("--index=%d", i)) {
			t.Errorf("%s runs %q, want pstrain standby --index=%d", task, args, i)
		}
		// ... serves the PS API on its cluster address and a data plane
		// of its own ...
		log := filepath.Join(r.dir, "logs", fmt.Sprintf("standby-%d.log", i))
		var dataAddr string
		waitFor(t, r, 30*time.Second, task+" listening", func() bool {
			b, _ := os.ReadFile(log)
			m := regexp.MustCompile(`msg="tcp data plane listening" self=\S+ addr=(\S+)`).FindSubmatch(b)
			if m != nil {
				dataAddr = string(m[1])
			}
			return m != nil && strings.Contains(string(b), `msg="parameter server listening" self=`+task+` addr=`+addr)
		})
		for _, a := range append(append([]string{}, spec.PS...), spec.Standby...) {
			if a == dataAddr {
				t.Errorf("%s's data plane %s is a task's gRPC address", task, dataAddr)
			}
		}
		// ... registers with the chief as standby/i and holds its
		// primary's snapshot.
		chiefLog := filepath.Join(r.dir, "logs", "chief.log")
		waitFor(t, r, 30*time.Second, task+" registered and attached", func() bool {
			b, _ := os.ReadFile(log)
			c, _ := os.ReadFile(chiefLog)
			return regexp.MustCompile(`msg="task registered" .*task=`+regexp.QuoteMeta(task)+` `).Match(c) &&
				strings.Contains(string(b), `msg="standby: snapshot installed"`)
		})
	}
}

// waitFor polls cond every 50 ms until it holds, failing the test with
// what after within (or if the run ends first).
func waitFor(t *testing.T, r *liveRun, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		select {
		case <-r.done:
			t.Fatalf("pstrain run ended before %s: %v\n%s", what, r.err, r.out)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v:\n%s", what, within, r.out)
		}
	}
}
