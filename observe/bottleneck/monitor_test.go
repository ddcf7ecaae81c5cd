package bottleneck

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pstrain/pstrain/observe/metrics"
)

// fakeCluster serves expositions that advance by one "second" of work per
// sample: each worker does 10 steps of 0.1 s (compute 0.06, pull 0.02, push
// 0.02) and uses 0.5 s of CPU. A task listed in down fails its scrape.
type fakeCluster struct {
	t    *testing.T
	mu   sync.Mutex
	now  time.Time
	n    map[string]int // samples served per URL
	down map[string]bool
}

func newFakeCluster(t *testing.T) *fakeCluster {
	return &fakeCluster{t: t, now: t0, n: map[string]int{}, down: map[string]bool{}}
}

func (f *fakeCluster) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeCluster) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func (f *fakeCluster) scrape(ctx context.Context, url string) (metrics.Families, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	k := float64(f.n[url])
	f.n[url]++
	down := f.down[url]
	f.mu.Unlock()
	if down {
		return nil, fmt.Errorf("scrape %s: connection refused", url)
	}
	host := proc{cpus: 2, load1: 2.5, cpu: 0.5 * k, rss: 100e6}
	switch {
	case strings.Contains(url, "worker"):
		return parse(f.t, workerText(host, 10*k, 0.2*k, 0.6*k, 0.2*k)), nil
	case strings.Contains(url, "ps"):
		return parse(f.t, psText(host, 0.05*k, 10*k)), nil
	}
	return parse(f.t, chiefText(host)), nil
}

func fakeTargets() []Target {
	return []Target{
		{Task: "chief", URL: "http://127.0.0.1:1/chief"},
		{Task: "ps/0", URL: "http://127.0.0.1:1/ps0"},
		{Task: "worker/0", URL: "http://127.0.0.1:1/worker0"},
	}
}

func newTestMonitor(t *testing.T, f *fakeCluster, max int) *Monitor {
	t.Helper()
	m, err := NewMonitor(MonitorConfig{Targets: fakeTargets(), Cores: 4, Scrape: f.scrape, Now: f.clock, MaxSnapshots: max})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMonitorWindowAndWhole(t *testing.T) {
	f := newFakeCluster(t)
	m := newTestMonitor(t, f, 0)
	ctx := t.Context()
	if _, err := m.Window(10 * time.Second); !errors.Is(err, ErrTooFewSnapshots) {
		t.Fatalf("Window before samples: err = %v", err)
	}
	for i := 0; i < 30; i++ {
		m.Sample(ctx)
		f.advance(time.Second)
	}
	// Newest sample at t0+29s; the window starts at the sample 10 s before.
	w, err := m.Window(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if w.WindowSeconds != 10 {
		t.Errorf("window = %vs, want 10", w.WindowSeconds)
	}
	whole, err := m.Whole()
	if err != nil {
		t.Fatal(err)
	}
	if whole.WindowSeconds != 29 {
		t.Errorf("whole = %vs, want 29", whole.WindowSeconds)
	}
	for _, b := range []Breakdown{w, whole} {
		if !near(b.StepsPerSecond, 10) || b.Phases == nil || !near(b.Phases.Compute, 0.6) || !near(b.Phases.BarrierWait, 0.05) || !near(b.Phases.Pull, 0.15) {
			t.Errorf("breakdown over %vs: steps/s %v, phases %+v", b.WindowSeconds, b.StepsPerSecond, b.Phases)
		}
		// load 2.5 on the 2 cores the host reports (not the 4 configured).
		if b.Verdict != VerdictCPU {
			t.Errorf("verdict %s (%s)", b.Verdict, b.Reason)
		}
	}
	// A window longer than the history covers all of it.
	if b, err := m.Window(time.Hour); err != nil || b.WindowSeconds != 29 {
		t.Errorf("Window(1h) = %vs, %v; want 29s", b.WindowSeconds, err)
	}
}

func TestMonitorDownTarget(t *testing.T) {
	f := newFakeCluster(t)
	f.down["http://127.0.0.1:1/ps0"] = true
	m := newTestMonitor(t, f, 0)
	m.Sample(t.Context())
	f.advance(2 * time.Second)
	snap := m.Sample(t.Context())
	if snap.Tasks[1].Up || !strings.Contains(snap.Tasks[1].Err, "connection refused") {
		t.Errorf("ps/0 sample = %+v, want down", snap.Tasks[1])
	}
	b, err := m.Whole()
	if err != nil {
		t.Fatal(err)
	}
	if b.Tasks[1].Up || b.BarrierWaitPerPullSeconds != nil || !near(b.Phases.Pull, 0.2) {
		t.Errorf("with ps/0 down: %+v, phases %+v", b.Tasks[1], b.Phases)
	}
}

func TestMonitorDecimates(t *testing.T) {
	f := newFakeCluster(t)
	m := newTestMonitor(t, f, 8)
	for i := 0; i < 20; i++ {
		m.Sample(t.Context())
		f.advance(time.Second)
	}
	if n := m.Snapshots(); n >= 8 || n < 4 {
		t.Errorf("history holds %d snapshots, want 4..7", n)
	}
	b, err := m.Whole()
	if err != nil {
		t.Fatal(err)
	}
	// First and last are kept, so the whole run still spans 19 s.
	if b.WindowSeconds != 19 || !near(b.StepsPerSecond, 10) {
		t.Errorf("whole after decimation: %vs, %v steps/s", b.WindowSeconds, b.StepsPerSecond)
	}
}

func TestMonitorRunStops(t *testing.T) {
	f := newFakeCluster(t)
	m := newTestMonitor(t, f, 0)
	ctx, cancel := context.WithCancel(t.Context())
	tick := make(chan time.Time)
	samples := make(chan Snapshot, 10)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, tick, func(s Snapshot) { samples <- s }) }()
	<-samples // the immediate sample
	f.advance(time.Second)
	tick <- time.Time{}
	<-samples
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	if n := m.Snapshots(); n != 2 && n != 3 {
		t.Errorf("%d snapshots, want 2 (or 3 if the cancel raced a last sample)", n)
	}
}

func TestNewMonitorErrors(t *testing.T) {
	ok := fakeTargets()
	cases := []struct {
		name string
		cfg  MonitorConfig
		want string
	}{
		{"no targets", MonitorConfig{Cores: 1}, "no targets"},
		{"no name", MonitorConfig{Targets: []Target{{URL: "http://x/metrics"}}, Cores: 1}, "no task name"},
		{"no url", MonitorConfig{Targets: []Target{{Task: "ps/0"}}, Cores: 1}, "ps/0 has no URL"},
		{"dup", MonitorConfig{Targets: []Target{ok[0], ok[0]}, Cores: 1}, "chief is listed twice"},
		{"cores", MonitorConfig{Targets: ok}, "cores must be positive"},
		{"max", MonitorConfig{Targets: ok, Cores: 1, MaxSnapshots: 2}, "at least 4"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewMonitor(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
}
