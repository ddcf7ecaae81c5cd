package bottleneck

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pstrain/pstrain/observe/metrics"
)

// ScrapeFunc fetches and parses one metrics URL; [metrics.Scrape] is one.
type ScrapeFunc func(ctx context.Context, url string) (metrics.Families, error)

// Defaults of [MonitorConfig].
const (
	DefaultScrapeTimeout = 2 * time.Second
	DefaultMaxSnapshots  = 4096
)

// MonitorConfig configures a [Monitor].
type MonitorConfig struct {
	// Targets are the tasks to scrape; at least one, with distinct Task names.
	Targets []Target
	// Cores is the CPU count assumed for a host that does not export
	// pstrain_host_cpus; normally runtime.NumCPU(). Must be positive.
	Cores int
	// Scrape fetches a target; nil means metrics.Scrape.
	Scrape ScrapeFunc
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Timeout bounds each target's scrape; 0 means DefaultScrapeTimeout.
	Timeout time.Duration
	// MaxSnapshots bounds the snapshots kept; when reached, every other one
	// after the first is dropped (a restart inside a dropped pair may then be
	// missed). 0 means DefaultMaxSnapshots; at least 4.
	MaxSnapshots int
}

// Monitor scrapes a fixed set of targets and keeps a compact history of
// snapshots, from which it computes breakdowns over a recent window or the
// whole run. Its methods are safe for concurrent use.
type Monitor struct {
	cfg MonitorConfig

	mu    sync.Mutex
	snaps []Snapshot
}

// NewMonitor checks c and returns a Monitor with an empty history.
func NewMonitor(c MonitorConfig) (*Monitor, error) {
	if len(c.Targets) == 0 {
		return nil, errors.New("bottleneck: no targets to monitor")
	}
	seen := map[string]bool{}
	for _, t := range c.Targets {
		switch {
		case t.Task == "":
			return nil, fmt.Errorf("bottleneck: target %q has no task name", t.URL)
		case t.URL == "":
			return nil, fmt.Errorf("bottleneck: target %s has no URL", t.Task)
		case seen[t.Task]:
			return nil, fmt.Errorf("bottleneck: task %s is listed twice", t.Task)
		}
		seen[t.Task] = true
	}
	if c.Cores < 1 {
		return nil, fmt.Errorf("bottleneck: cores must be positive, got %d", c.Cores)
	}
	if c.Scrape == nil {
		c.Scrape = metrics.Scrape
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultScrapeTimeout
	}
	if c.MaxSnapshots == 0 {
		c.MaxSnapshots = DefaultMaxSnapshots
	}
	if c.MaxSnapshots < 4 {
		return nil, fmt.Errorf("bottleneck: MaxSnapshots must be at least 4, got %d", c.MaxSnapshots)
	}
	c.Targets = append([]Target(nil), c.Targets...)
	return &Monitor{cfg: c}, nil
}

// Sample scrapes every target concurrently (each bounded by the timeout),
// stamps the snapshot with the clock read after the scrapes, adds it to the
// history and returns it. A target that cannot be scraped is recorded as
// down with the error; that is not an error of Sample.
func (m *Monitor) Sample(ctx context.Context) Snapshot {
	tasks := make([]TaskSample, len(m.cfg.Targets))
	var wg sync.WaitGroup
	for i, t := range m.cfg.Targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
			defer cancel()
			fams, err := m.cfg.Scrape(sctx, t.URL)
			ts := TaskSample{Target: t, Up: err == nil}
			if err != nil {
				ts.Err = err.Error()
			} else {
				ts.Reading = Extract(fams)
			}
			tasks[i] = ts
		}()
	}
	wg.Wait()
	snap := Snapshot{Time: m.cfg.Now(), Tasks: tasks}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snaps = append(m.snaps, snap)
	if len(m.snaps) >= m.cfg.MaxSnapshots {
		// A fresh slice: readers may still hold the old one.
		kept := make([]Snapshot, 0, len(m.snaps)/2+2)
		kept = append(kept, m.snaps[0])
		for i := 2; i < len(m.snaps)-1; i += 2 {
			kept = append(kept, m.snaps[i])
		}
		m.snaps = append(kept, m.snaps[len(m.snaps)-1])
	}
	return snap
}

// Run samples at once and then at every tick until ctx is done, and returns
// ctx's error. onSample, if not nil, is called with each snapshot (from
// Run's goroutine). Pass time.NewTicker(d).C as tick (and stop the ticker
// afterwards).
func (m *Monitor) Run(ctx context.Context, tick <-chan time.Time, onSample func(Snapshot)) error {
	for {
		snap := m.Sample(ctx)
		if onSample != nil {
			onSample(snap)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
		}
	}
}

// Window returns the breakdown from the most recent snapshot at least d
// older than the newest one (or the oldest, if none is that old) to the
// newest: the live view over roughly the last d. It returns
// ErrTooFewSnapshots before two samples.
func (m *Monitor) Window(d time.Duration) (Breakdown, error) {
	m.mu.Lock()
	snaps := m.snaps
	m.mu.Unlock()
	if len(snaps) < 2 {
		return Breakdown{}, ErrTooFewSnapshots
	}
	return Compute(snaps[windowStart(snaps, d):], m.cfg.Cores)
}

// Whole returns the breakdown from the first snapshot to the last: the
// summary of the run. It returns ErrTooFewSnapshots before two samples.
func (m *Monitor) Whole() (Breakdown, error) {
	m.mu.Lock()
	snaps := m.snaps
	m.mu.Unlock()
	return Compute(snaps, m.cfg.Cores)
}

// Snapshots returns how many snapshots the history holds.
func (m *Monitor) Snapshots() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.snaps)
}
