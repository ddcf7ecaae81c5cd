package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pstrain/pstrain/observe/bottleneck"
	"github.com/pstrain/pstrain/observe/metrics"
)

// topCluster is a chief, a PS and a worker serving real registries on
// loopback, with the metrics objects to make them move.
type topCluster struct {
	worker *metrics.Worker
	ps     *metrics.PS
	urls   map[string]string // task -> host:port
}

func startTopCluster(t *testing.T) *topCluster {
	t.Helper()
	c := &topCluster{urls: map[string]string{}}
	for _, name := range []string{"chief", "ps/0", "worker/0"} {
		reg := metrics.NewRegistry("test")
		switch name {
		case "chief":
			metrics.NewChief(reg)
		case "ps/0":
			c.ps = metrics.NewPS(reg)
		case "worker/0":
			c.worker = metrics.NewWorker(reg)
		}
		srv := metrics.NewServer(reg, nil, nil)
		if err := srv.Start(t.Context(), "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		c.urls[name] = srv.Addr()
	}
	return c
}

// steps records n worker steps of 0.1 s (compute 0.06, pull 0.03 of which
// the shard held 0.01 at the barrier, push 0.01).
func (c *topCluster) steps(n int) {
	for i := 0; i < n; i++ {
		c.worker.ObservePhase(metrics.PhaseCompute, 60*time.Millisecond)
		c.worker.ObservePhase(metrics.PhasePull, 30*time.Millisecond)
		c.worker.ObservePhase(metrics.PhasePush, 10*time.Millisecond)
		c.worker.Steps.Inc()
		c.worker.Samples.Add(128)
		c.ps.BarrierWait.Observe(0.01)
	}
}

// deadAddr returns a loopback address nobody listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func writeSD(t *testing.T, c *topCluster, dead string) string {
	t.Helper()
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	gs := []group{
		{[]string{c.urls["worker/0"]}, map[string]string{"role": "worker", "task": "worker/0"}},
		{[]string{c.urls["chief"]}, map[string]string{"role": "chief", "task": "chief"}},
		{[]string{c.urls["ps/0"]}, map[string]string{"role": "ps", "task": "ps/0"}},
		{[]string{dead}, map[string]string{"role": "worker", "task": "worker/1"}},
	}
	b, err := json.Marshal(gs)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pstrain.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// row returns the fields of the table row of task in out.
func row(t *testing.T, out, task string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == task {
			return f
		}
	}
	t.Fatalf("no row for %s in\n%s", task, out)
	return nil
}

func TestTopOnceFromTargets(t *testing.T) {
	c := startTopCluster(t)
	c.steps(5)
	sd := writeSD(t, c, deadAddr(t))
	targets, err := sdTargets(sd)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = runTop(t.Context(), topOptions{targets: targets, interval: 20 * time.Millisecond, window: time.Second,
		once: true, cores: 2, between: func() { c.steps(10) }}, &out)
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	t.Log("\n" + s)
	// TASK ROLE STATE STEPS/S COMPUTE PUSH PULL BARRIER CPU RSS LOAD
	w := row(t, s, "worker/0")
	if got := strings.Join(w[1:3], " ") + " " + strings.Join(w[4:8], " "); got != "worker up 60% 10% 20% 10%" {
		t.Errorf("worker/0 row = %v, want role, state and phases worker up 60%% 10%% 20%% 10%%", w)
	}
	if v, err := strconv.ParseFloat(w[3], 64); err != nil || v <= 0 {
		t.Errorf("worker/0 steps/s = %q, want a positive number", w[3])
	}
	if !regexp.MustCompile(`^\d+%$`).MatchString(w[8]) || !regexp.MustCompile(`^\d+\.\d$`).MatchString(w[9]) {
		t.Errorf("worker/0 CPU, RSS = %q, %q; want a percentage and MiB", w[8], w[9])
	}
	if p := row(t, s, "ps/0"); p[1] != "ps" || p[3] != "-" {
		t.Errorf("ps/0 row = %v", p)
	}
	if d := row(t, s, "worker/1"); d[2] != "DOWN" {
		t.Errorf("worker/1 row = %v, want DOWN", d)
	}
	// Rows in task order, whatever the order of the target file.
	if strings.Index(s, "\nchief") > strings.Index(s, "\nps/0") || strings.Index(s, "\nps/0") > strings.Index(s, "\nworker/0") {
		t.Errorf("rows out of order:\n%s", s)
	}
	if !strings.Contains(s, "step time: compute 60%, push 10%, pull 20%, barrier wait 10%") {
		t.Errorf("no bottleneck line with the phases in\n%s", s)
	}
	if !strings.Contains(s, "down: worker/1: ") {
		t.Errorf("the dead target's error is not shown:\n%s", s)
	}
	if !strings.Contains(s, "workers: 1 up of 2") {
		t.Errorf("no worker count (1 up of 2) in\n%s", s)
	}
	if !strings.Contains(s, "parameter servers: 1 up of 1") {
		t.Errorf("no PS count (1 up of 1) in\n%s", s)
	}
}

// With hot standbys the ROLE column says which process of a shard serves
// it: after a failover standby/0 is the primary and ps/0 its standby.
func TestTopShowsReplicaRoles(t *testing.T) {
	b := bottleneck.Breakdown{Tasks: []bottleneck.Task{
		{Task: "ps/0", Role: "ps", Up: true, Replica: "standby"},
		{Task: "ps/1", Role: "ps", Up: true, Replica: "primary"},
		{Task: "standby/0", Role: "ps", Up: true, Replica: "primary"},
		{Task: "standby/1", Role: "ps", Up: true, Replica: "deposed"},
	}}
	var out bytes.Buffer
	renderTop(&out, b)
	for task, want := range map[string]string{"ps/0": "ps-standby", "ps/1": "ps-primary", "standby/0": "ps-primary", "standby/1": "ps-deposed"} {
		if r := row(t, out.String(), task); r[1] != want {
			t.Errorf("%s's role %q, want %q:\n%s", task, r[1], want, out.String())
		}
	}
	// The PS count is the shards': their primaries.
	if !strings.Contains(out.String(), "parameter servers: 2 up of 2\n") {
		t.Errorf("no PS count of 2 shards in\n%s", out.String())
	}
	// Each shard's parameters, when every one says them (uneven after a
	// rebalance).
	out.Reset()
	p0, p1 := 159200.0, 476810.0
	renderTop(&out, bottleneck.Breakdown{Tasks: []bottleneck.Task{{Task: "ps/0", Role: "ps", Up: true, Parameters: &p0},
		{Task: "ps/1", Role: "ps", Up: true, Parameters: &p1}}})
	if !strings.Contains(out.String(), "parameter servers: 2 up of 2, parameters 159200 / 476810\n") {
		t.Errorf("no shard parameters in\n%s", out.String())
	}
	// Without standbys every PS is its shard's primary: not worth a word.
	out.Reset()
	renderTop(&out, bottleneck.Breakdown{Tasks: []bottleneck.Task{{Task: "ps/0", Role: "ps", Up: true, Replica: "primary"}}})
	if r := row(t, out.String(), "ps/0"); r[1] != "ps" {
		t.Errorf("ps/0's role %q without standbys, want ps", r[1])
	}
}

func TestTopOnceFromCluster(t *testing.T) {
	c := startTopCluster(t)
	grpc := func(metricsAddr string) string {
		host, port, _ := net.SplitHostPort(metricsAddr)
		p, _ := strconv.Atoi(port)
		return net.JoinHostPort(host, strconv.Itoa(p-1000))
	}
	spec := fmt.Sprintf(`{"chief": [%q], "ps": [%q], "worker": [%q]}`, grpc(c.urls["chief"]), grpc(c.urls["ps/0"]), grpc(c.urls["worker/0"]))
	file := filepath.Join(t.TempDir(), "cluster.json")
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := cmdTop(t.Context(), []string{"--cluster", file, "--once", "--interval", "20ms"}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	for _, task := range []string{"chief", "ps/0", "worker/0"} {
		if r := row(t, out.String(), task); r[2] != "up" {
			t.Errorf("%s row = %v, want up", task, r)
		}
	}
	if !strings.Contains(out.String(), "(idle)") {
		t.Errorf("no steps were taken, yet the verdict is not idle:\n%s", out.String())
	}
}

func TestTopLiveStopsOnCancel(t *testing.T) {
	c := startTopCluster(t)
	targets, err := sdTargets(writeSD(t, c, deadAddr(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	w := &notifyWriter{ch: make(chan string, 100)}
	done := make(chan error, 1)
	go func() {
		done <- runTop(ctx, topOptions{targets: targets, interval: 10 * time.Millisecond, window: time.Second, cores: 2}, w)
	}()
	// Wait for a refresh that has a table (the second one or later).
	for s := range w.ch {
		if strings.Contains(s, "step time:") {
			if !strings.HasPrefix(s, clearScreen) {
				t.Errorf("a live refresh does not clear the screen: %q", s)
			}
			break
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("runTop after cancel: %v, want nil", err)
	}
}

// notifyWriter sends each write on ch (dropping it if ch is full).
type notifyWriter struct{ ch chan string }

func (w *notifyWriter) Write(p []byte) (int, error) {
	select {
	case w.ch <- string(p):
	default:
	}
	return len(p), nil
}

func TestTopBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"not": "a list"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(empty, []byte(`[]`), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--targets", filepath.Join(dir, "nope.json"), "--once"}, "does not exist: start a run"},
		{[]string{"--targets", bad, "--once"}, "not a Prometheus file_sd list"},
		{[]string{"--targets", empty, "--once"}, "lists no targets"},
		{[]string{"--targets", bad, "--cluster", bad}, "not both"},
		{[]string{"--cluster", filepath.Join(dir, "nope.json")}, "cluster file"},
		{[]string{"--interval", "0s"}, "--interval must be positive"},
		{[]string{"--window", "-1s"}, "--window must be positive"},
		{[]string{"extra"}, "unexpected argument"},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		err := cmdTop(t.Context(), c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pstrain top %v: err = %v, want one containing %q", c.args, err, c.want)
		}
	}
}

// No task answering is a failure: `pstrain top --once` prints the table
// (every task DOWN, each one's error) and exits with status 1.
func TestTopOnceFailsWhenNoTaskAnswers(t *testing.T) {
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	b, err := json.Marshal([]group{
		{[]string{deadAddr(t)}, map[string]string{"role": "chief", "task": "chief"}},
		{[]string{deadAddr(t)}, map[string]string{"role": "worker", "task": "worker/0"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sd := filepath.Join(t.TempDir(), "pstrain.json")
	if err := os.WriteFile(sd, b, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin.Path(t), "top", "--once", "--interval", "10ms", "--targets", sd)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("pstrain top --once with no task up: %v, want exit status 1\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if r := row(t, stdout.String(), "worker/0"); r[2] != "DOWN" {
		t.Errorf("worker/0 row = %v, want DOWN", r)
	}
	if !strings.Contains(stderr.String(), "none of the 2 tasks answered") {
		t.Errorf("stderr %q does not say no task answered", stderr.String())
	}
}

// The live view follows the target file: an elastic run's workers come
// and go (docs/elastic.md).
func TestTopLiveFollowsTargets(t *testing.T) {
	c := startTopCluster(t)
	targets, err := sdTargets(writeSD(t, c, deadAddr(t)))
	if err != nil {
		t.Fatal(err)
	}
	fewer := slices.DeleteFunc(slices.Clone(targets), func(x bottleneck.Target) bool { return x.Task == "worker/1" })
	var mu sync.Mutex
	current := targets
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &notifyWriter{ch: make(chan string, 100)}
	done := make(chan error, 1)
	go func() {
		done <- runTop(ctx, topOptions{targets: targets, interval: 10 * time.Millisecond, window: time.Second, cores: 2,
			reload: func() ([]bottleneck.Target, error) { mu.Lock(); defer mu.Unlock(); return current, nil }}, w)
	}()
	deadline := time.After(20 * time.Second)
	saw := func(want string) {
		t.Helper()
		for {
			select {
			case s := <-w.ch:
				if strings.Contains(s, want) {
					return
				}
			case <-deadline:
				t.Fatalf("no refresh with %q", want)
			}
		}
	}
	saw("workers: 1 up of 2")
	mu.Lock()
	current = fewer
	mu.Unlock()
	saw("workers: 1 up of 1")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("runTop after cancel: %v, want nil", err)
	}
}

// A straggler is named on its row and on the bottleneck line.
func TestTopNamesStraggler(t *testing.T) {
	phases := &bottleneck.Phases{Compute: 0.6, Push: 0.3, Pull: 0.1}
	st := bottleneck.Straggler{Task: "worker/1", Slowdown: 2.94, OwnStepSeconds: 0.036, OthersStepSeconds: 0.01224}
	b := bottleneck.Breakdown{WindowSeconds: 5, StepsPerSecond: 80, Phases: phases, Verdict: bottleneck.VerdictBarrier,
		Tasks: []bottleneck.Task{
			{Task: "worker/0", Role: bottleneck.RoleWorker, Up: true, StepsPerSecond: 40, Phases: phases},
			{Task: "worker/1", Role: bottleneck.RoleWorker, Up: true, StepsPerSecond: 40, Phases: phases},
		},
		Stragglers: []bottleneck.Straggler{st}}
	var out bytes.Buffer
	renderTop(&out, b)
	if r := row(t, out.String(), "worker/1"); r[len(r)-1] != "2.9x" {
		t.Errorf("worker/1 row %v, want it to end with 2.9x", r)
	}
	if r := row(t, out.String(), "worker/0"); r[len(r)-1] != "-" {
		t.Errorf("worker/0 row %v, want it to end with -", r)
	}
	if !strings.Contains(out.String(), "worker/1 is 2.9x slower than the others (compute and push 36 ms a step against 12 ms)") {
		t.Errorf("no straggler on the bottleneck line:\n%s", out.String())
	}
}
