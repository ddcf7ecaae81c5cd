package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
)

// WatchRunner is a Runner that also calls watch while the cluster runs
// (ExecRunner: with the run's directory, whose targets/pstrain.json lists
// the tasks' metrics addresses).
type WatchRunner interface {
	Runner
	RunWatched(ctx context.Context, args []string, watch func(ctx context.Context, runDir string)) (*report.Report, time.Duration, error)
}

// RunWatched implements WatchRunner.
func (e *ExecRunner) RunWatched(ctx context.Context, args []string, watch func(ctx context.Context, runDir string)) (*report.Report, time.Duration, error) {
	return e.run(ctx, args, watch)
}

// runWatched runs cmd with watch (unless nil) beside it until cmd exits.
func runWatched(ctx context.Context, cmd *exec.Cmd, dir string, watch func(context.Context, string)) error {
	if watch == nil {
		return cmd.Run()
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		watch(wctx, dir)
	}()
	err := cmd.Run()
	stop()
	wg.Wait()
	return err
}

// ShardReading is what one PS's /metrics said.
type ShardReading struct {
	Rows       float64 // pstrain_ps_table_rows, every table
	TableBytes float64 // pstrain_ps_table_bytes: rows and their optimizer state
	PullKeys   float64 // pstrain_ps_table_row_requests_total{op="pull"}
	PushKeys   float64 // ... {op="push"}
	RowBytes   float64 // payload bytes of the row pulls and pushes, both ways
	DenseBytes float64 // payload bytes of the dense pulls and pushes
	CPUSeconds float64 // process_cpu_seconds_total
}

// Snapshot is one scrape of every PS and worker of a run.
type Snapshot struct {
	At     time.Time
	Shards []ShardReading // by shard index
	// WorkerSteps, WorkerSamples and WorkerCPUSeconds are the sums over
	// the workers.
	WorkerSteps, WorkerSamples, WorkerCPUSeconds float64
}

// target is one entry of the launcher's file_sd file.
type target struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// readTargets reads a run's targets file: each task's metrics address,
// by task name ("ps/0").
func readTargets(runDir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(runDir, "targets", "pstrain.json"))
	if err != nil {
		return nil, err
	}
	var gs []target
	if err := json.Unmarshal(b, &gs); err != nil {
		return nil, fmt.Errorf("bench: targets: %w", err)
	}
	out := map[string]string{}
	for _, g := range gs {
		if len(g.Targets) == 1 && g.Labels["task"] != "" {
			out[g.Labels["task"]] = g.Targets[0]
		}
	}
	return out, nil
}

// Scraper takes snapshots of a run's PS and workers every Interval.
type Scraper struct {
	PS, Workers int
	Interval    time.Duration
	Now         Clock

	mu    sync.Mutex
	snaps []Snapshot
}

// Snapshots are the complete snapshots taken, in order.
func (s *Scraper) Snapshots() []Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Snapshot(nil), s.snaps...)
}

// Watch scrapes runDir's tasks until ctx ends (a WatchRunner's watch).
// A scrape that misses a task (not started yet, or already gone) is
// skipped.
func (s *Scraper) Watch(ctx context.Context, runDir string) {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if snap, err := s.scrape(ctx, runDir); err == nil {
			s.mu.Lock()
			s.snaps = append(s.snaps, snap)
			s.mu.Unlock()
		}
	}
}

// scrape reads every PS and worker once.
func (s *Scraper) scrape(ctx context.Context, runDir string) (Snapshot, error) {
	addrs, err := readTargets(runDir)
	if err != nil {
		return Snapshot{}, err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	snap := Snapshot{At: s.Now()}
	for i := range s.PS {
		f, err := scrapeTask(sctx, addrs, fmt.Sprintf("ps/%d", i))
		if err != nil {
			return Snapshot{}, err
		}
		snap.Shards = append(snap.Shards, shardReading(f))
	}
	for i := range s.Workers {
		f, err := scrapeTask(sctx, addrs, fmt.Sprintf("worker/%d", i))
		if err != nil {
			return Snapshot{}, err
		}
		snap.WorkerSteps += f.Sum(metrics.MetricWorkerSteps, nil)
		snap.WorkerSamples += f.Sum(metrics.MetricWorkerSamples, nil)
		snap.WorkerCPUSeconds += f.Sum(metricProcessCPU, nil)
	}
	return snap, nil
}

func scrapeTask(ctx context.Context, addrs map[string]string, task string) (metrics.Families, error) {
	a, ok := addrs[task]
	if !ok {
		return nil, fmt.Errorf("bench: no target for %s", task)
	}
	return metrics.Scrape(ctx, "http://"+a+"/metrics")
}

func shardReading(f metrics.Families) ShardReading {
	op := func(o string) map[string]string { return map[string]string{metrics.LabelOp: o} }
	return ShardReading{
		Rows:       f.Sum(metrics.MetricPSTableRows, nil),
		TableBytes: f.Sum(metrics.MetricPSTableBytes, nil),
		PullKeys:   f.Sum(metrics.MetricPSTableRowRequests, op("pull")),
		PushKeys:   f.Sum(metrics.MetricPSTableRowRequests, op("push")),
		RowBytes: f.Sum(metrics.MetricRPCSentBytes, op("pull_rows")) + f.Sum(metrics.MetricRPCReceivedBytes, op("pull_rows")) +
			f.Sum(metrics.MetricRPCReceivedBytes, op("push_rows")),
		DenseBytes: f.Sum(metrics.MetricRPCSentBytes, op("pull")) + f.Sum(metrics.MetricRPCReceivedBytes, op("push")),
		CPUSeconds: f.Sum(metricProcessCPU, nil),
	}
}

// metricProcessCPU is the Go client's process collector's CPU counter.
const metricProcessCPU = "process_cpu_seconds_total"

// ErrNoWindow is returned when a run's snapshots hold no stretch of
// training to measure.
var ErrNoWindow = errors.New("bench: no two snapshots taken while the workers trained")

// TrainingWindow picks the stretch of snaps to measure: from the first
// snapshot at which the workers had done skip (a fraction) of the steps
// the snapshots saw, to the last one after which they still stepped (so
// training was still going at both ends: start-up, the first steps and
// the chief's final evaluation, whose row pulls the PS count too, are
// left out).
func TrainingWindow(snaps []Snapshot, skip float64) (from, to Snapshot, err error) {
	if len(snaps) < 2 {
		return from, to, ErrNoWindow
	}
	sort.SliceStable(snaps, func(i, j int) bool { return snaps[i].At.Before(snaps[j].At) })
	last := snaps[len(snaps)-1].WorkerSteps
	i := sort.Search(len(snaps), func(i int) bool { return snaps[i].WorkerSteps >= skip*last && snaps[i].WorkerSteps > 0 })
	j := -1
	for k := len(snaps) - 2; k >= 0; k-- {
		if snaps[k+1].WorkerSteps > snaps[k].WorkerSteps {
			j = k
			break
		}
	}
	if i >= len(snaps) || j <= i {
		return from, to, ErrNoWindow
	}
	return snaps[i], snaps[j], nil
}
