package sweep

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// The test binary doubles as a fake `pstrain run` when this variable is set.
const fakeEnv = "PSTRAIN_SWEEP_FAKE_RUN"

func TestMain(m *testing.M) {
	if os.Getenv(fakeEnv) != "" {
		os.Exit(fakeRun(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeRun imitates `pstrain run`: it serves /metrics, lists itself in the
// file_sd file, waits until it has been scraped twice and writes a report.
// --lr 0.5 makes it fail; --lr 0.25 makes it wait for SIGTERM. Each
// invocation appends its --lr and --seed to the file named by fakeEnv.
func fakeRun(args []string) int {
	if len(args) == 0 || args[0] != "run" {
		return 2
	}
	if len(args) > 1 && args[1] == DryRunFlag {
		return fakeDryRun(args[2:])
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	rp := fs.String("report", "", "")
	sd := fs.String("sd-dir", "", "")
	lr := fs.String("lr", "", "")
	seed := fs.String("seed", "", "")
	for _, k := range []string{"run-dir", "data-dir"} {
		fs.String(k, "", "")
	}
	for _, k := range Keys() {
		if fs.Lookup(k) == nil {
			fs.String(k, "", "")
		}
	}
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	f, _ := os.OpenFile(os.Getenv(fakeEnv), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	fmt.Fprintf(f, "lr=%s seed=%s\n", *lr, *seed)
	f.Close()
	if *lr == "0.125" { // report the CPUs this process may use
		// Last as a run does, many sampling periods (ProcEvery 20 ms), so
		// that the sweep's watcher sees this process even on a loaded
		// machine under -race; a process gone in a few milliseconds
		// leaves no evidence (the CI run that hit this).
		time.Sleep(500 * time.Millisecond)
		own, _ := OwnCPUs()
		return fakeReport(*rp, FormatCPUList(own))
	}
	switch *lr {
	case "0.5":
		fmt.Println("fake: diverged")
		return 1
	case "0.25":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM)
		<-ch
		return 1
	}
	var hits atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 3
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "process_cpu_seconds_total 1.5\nprocess_resident_memory_bytes 1048576\npstrain_host_load1 0.75\n")
		hits.Add(1)
	}))
	tg, _ := json.Marshal([]target{{Targets: []string{ln.Addr().String()}, Labels: map[string]string{"role": "worker", "task": "worker/0"}}})
	os.MkdirAll(*sd, 0o755)
	os.WriteFile(filepath.Join(*sd, targetsFile), tg, 0o644)
	deadline := time.Now().Add(20 * time.Second)
	// A third scrape starts only after the sampler recorded the second
	// (it scrapes one at a time): then two samples are certainly kept.
	for hits.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return fakeReport(*rp, "epochs")
}

// fakeReport writes the fake run's report, stopped by stoppedBy.
func fakeReport(path, stoppedBy string) int {
	ttt := 3.0
	rep := report.Report{Mode: "sync", GlobalSteps: 42, TrainSeconds: 4, TestAccuracy: 0.9, BestTestAccuracy: 0.91,
		TimeToTargetSeconds: &ttt, SamplesPerSecond: 1234, StoppedBy: stoppedBy,
		Tasks: map[string]report.Task{"chief": {PeakRSSBytes: 100, CPUSeconds: 1}, "ps/0": {PeakRSSBytes: 50, CPUSeconds: 2},
			"worker/0": {PeakRSSBytes: 300, CPUSeconds: 5}, "worker/1": {PeakRSSBytes: 200, CPUSeconds: 4}}}
	if err := rep.Write(path); err != nil {
		return 4
	}
	return 0
}

func fakeOptions(t *testing.T, grid string) (Options, string) {
	t.Helper()
	g, err := ParseGrid(grid)
	if err != nil {
		t.Fatal(err)
	}
	own, err := OwnCPUs()
	if err != nil {
		t.Fatal(err)
	}
	cs, err := g.Expand(fakeResolve, len(own))
	if err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "invocations")
	t.Setenv(fakeEnv, log)
	return Options{Exe: os.Args[0], Dir: t.TempDir(), DataDir: "data", Configs: cs, Repeat: 2, SampleEvery: 50 * time.Millisecond,
		CPUs: own, ProcEvery: 20 * time.Millisecond}, log
}

func invocations(t *testing.T, log string) []string {
	b, err := os.ReadFile(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestRunWritesResultsAndResumes(t *testing.T) {
	o, log := fakeOptions(t, "lr=0.1,0.2;seed=7")
	var progress bytes.Buffer
	o.Progress = &progress
	rows, err := Run(context.Background(), o)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	// Repeats use successive seeds.
	if got := strings.Join(invocations(t, log), " "); got != "lr=0.1 seed=7 lr=0.1 seed=8 lr=0.2 seed=7 lr=0.2 seed=8" {
		t.Errorf("invocations %q", got)
	}
	r := rows[1]
	if r.Status != StatusOK || r.Repeat != 1 || r.Seed != 8 || r.Params["lr"] != "0.1" || r.GlobalSteps != 42 || r.TimeToTargetSeconds != 3 {
		t.Errorf("row %+v", r)
	}
	if r.CPUTotal != 12 || r.CPUWorker != 9 || r.RSSWorker != 300 || r.RSSTotal != 650 || r.RSSPS != 50 {
		t.Errorf("per-role resources %+v", r)
	}
	if r.Load1Mean != 0.75 || r.Load1Max != 0.75 || r.WallSeconds <= 0 {
		t.Errorf("load %v/%v wall %v", r.Load1Mean, r.Load1Max, r.WallSeconds)
	}
	samples, err := ReadRunSamples(o.Dir, r.RunID)
	if err != nil || len(samples) < 2 || samples[0].Task != "worker/0" || samples[0].RSSBytes != 1<<20 || samples[0].CPUSeconds != 1.5 {
		t.Errorf("samples %+v: %v", samples, err)
	}
	if _, err := os.Stat(filepath.Join(RunDir(o.Dir, r.RunID), ClusterDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cluster directory of a finished run was kept: %v", err)
	}
	onDisk, err := ReadResults(o.Dir)
	if err != nil || len(onDisk) != 4 || onDisk[3].Params["lr"] != "0.2" {
		t.Fatalf("results.csv: %v %+v", err, onDisk)
	}
	md, _ := os.ReadFile(filepath.Join(o.Dir, SummaryFile))
	if !strings.Contains(string(md), "## By lr") {
		t.Errorf("summary:\n%s", md)
	}
	if !strings.Contains(progress.String(), "[4/4]") || !strings.Contains(progress.String(), "ETA") {
		t.Errorf("progress:\n%s", progress.String())
	}

	// Again, with one more value: only the new configuration runs.
	o2, _ := fakeOptions(t, "lr=0.1,0.2,0.3;seed=7")
	o2.Dir = o.Dir
	t.Setenv(fakeEnv, log)
	progress.Reset()
	o2.Progress = &progress
	rows, err = Run(context.Background(), o2)
	if err != nil || len(rows) != 6 {
		t.Fatalf("resume: %d rows, %v", len(rows), err)
	}
	if got := invocations(t, log); len(got) != 6 || got[4] != "lr=0.3 seed=7" {
		t.Errorf("resume ran %v", got)
	}
	if !strings.Contains(progress.String(), "4 of 6 runs already finished") {
		t.Errorf("progress:\n%s", progress.String())
	}
	if rows[1].WallSeconds <= 0 || rows[1].Load1Mean != 0.75 {
		t.Errorf("resumed row lost measurements: %+v", rows[1])
	}
}

func TestRunRecordsFailures(t *testing.T) {
	o, _ := fakeOptions(t, "lr=0.5,0.1")
	o.Repeat = 1
	rows, err := Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 runs failed") {
		t.Fatalf("err = %v", err)
	}
	if len(rows) != 2 || rows[0].Status != StatusFailed || !strings.Contains(rows[0].Error, "fake: diverged") || rows[1].Status != StatusOK {
		t.Fatalf("rows %+v", rows)
	}
	onDisk, _ := ReadResults(o.Dir)
	if len(onDisk) != 2 || onDisk[0].Status != StatusFailed {
		t.Errorf("results.csv %+v", onDisk)
	}
}

// Cancelling stops the running configuration and leaves results for the
// finished ones.
func TestRunCancelKeepsFinished(t *testing.T) {
	o, log := fakeOptions(t, "lr=0.1,0.25,0.2")
	o.Repeat = 1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Cancel once the blocking configuration has started.
		for len(invocations(t, log)) < 2 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	rows, err := Run(ctx, o)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if len(rows) != 1 || rows[0].Params["lr"] != "0.1" {
		t.Fatalf("rows %+v", rows)
	}
	onDisk, err := ReadResults(o.Dir)
	if err != nil || len(onDisk) != 1 {
		t.Fatalf("results.csv after cancel: %v %+v", err, onDisk)
	}
	if got := invocations(t, log); len(got) != 2 {
		t.Errorf("ran %v after the cancel", got)
	}
}

// cpus=1 starts the run under taskset: the run itself finds itself on one
// CPU, the evidence says so, and results.csv records both.
func TestRunPinsCPUs(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset")
	}
	o, _ := fakeOptions(t, "lr=0.125;cpus=1,all")
	o.Repeat = 1
	rows, err := Run(context.Background(), o)
	if err != nil || len(rows) != 2 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	first := FormatCPUList(o.CPUs[:1])
	if r := rows[0]; r.Params[KeyCPUs] != "1" || r.StoppedBy != first || r.CPUsAllowed != first {
		t.Errorf("cpus=1: the run saw CPUs %q, evidence %q; want %q", r.StoppedBy, r.CPUsAllowed, first)
	}
	if r := rows[1]; r.Params[KeyCPUs] != CPUsAll || r.StoppedBy != FormatCPUList(o.CPUs) || r.CPUsAllowed != FormatCPUList(o.CPUs) {
		t.Errorf("cpus=all: the run saw CPUs %q, evidence %q; want %q", r.StoppedBy, r.CPUsAllowed, FormatCPUList(o.CPUs))
	}
	for _, r := range rows {
		if math.IsNaN(r.RunQueueMean) || math.IsNaN(r.RunCPUSeconds) || r.RunCPUSeconds < 0 || math.IsNaN(r.HostCPUSeconds) {
			t.Errorf("evidence missing: %+v", r)
		}
	}
	var m meta
	b, _ := os.ReadFile(filepath.Join(RunDir(o.Dir, rows[0].RunID), MetaFile))
	if err := json.Unmarshal(b, &m); err != nil || len(m.Command) < 3 || m.Command[0] != "taskset" || m.Command[2] != first {
		t.Errorf("meta.json command %v: %v", m.Command, err)
	}
	onDisk, err := ReadResults(o.Dir)
	if err != nil || onDisk[0].Params[KeyCPUs] != "1" || onDisk[0].CPUsAllowed != first {
		t.Errorf("results.csv: %v %+v", err, onDisk)
	}
}
