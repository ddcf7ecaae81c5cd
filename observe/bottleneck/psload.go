package bottleneck

import (
	"fmt"
	"time"
)

// PSLoad is what a window of scrapes says of one parameter server's
// load (docs/elastic.md, "Rebalancing"): the parameters it holds, the
// gradients it took in and the wall-clock seconds its push handler spent
// on them (pstrain_ps_request_duration_seconds{op="push"}).
type PSLoad struct {
	Task    string
	Params  int
	Pushes  float64
	Seconds float64
}

// PSLoads is the load of each PS target over the window from the
// most recent snapshot at least d older than the newest (or the oldest)
// to the newest. It fails when there are fewer than two snapshots, or
// when a PS was down at either end, restarted in the window (a counter
// went back), or changed its parameter count (a layout change in the
// window): its figures would mix two layouts.
func (m *Monitor) PSLoads(d time.Duration) ([]PSLoad, error) {
	m.mu.Lock()
	snaps := m.snaps
	m.mu.Unlock()
	if len(snaps) < 2 {
		return nil, ErrTooFewSnapshots
	}
	first, last := snaps[windowStart(snaps, d)], snaps[len(snaps)-1]
	var out []PSLoad
	for i, t := range last.Tasks {
		if t.Target.role() != RolePS {
			continue
		}
		a := first.Tasks[i]
		if !a.Up || !t.Up {
			return nil, fmt.Errorf("%s could not be scraped over the last %s", t.Target.Task, last.Time.Sub(first.Time).Round(time.Second))
		}
		l, err := psLoadOf(t.Target.Task, a.Reading, t.Reading)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// psLoadOf is task's load between readings a and b.
func psLoadOf(task string, a, b Reading) (PSLoad, error) {
	pa, pb := a.Gauges[keyShardParams], b.Gauges[keyShardParams]
	l := PSLoad{Task: task, Params: int(pb), Pushes: b.Counters[keyPushCount] - a.Counters[keyPushCount],
		Seconds: b.Counters[keyPushSum] - a.Counters[keyPushSum]}
	switch {
	case pa != pb:
		return PSLoad{}, fmt.Errorf("%s's parameters changed from %.0f to %.0f in the window (a layout change): measure again", task, pa, pb)
	case l.Pushes < 0 || l.Seconds < 0:
		return PSLoad{}, fmt.Errorf("%s restarted in the window: measure again", task)
	}
	return l, nil
}

// windowStart is the index of the most recent snapshot at least d older
// than the newest one (0 if none is that old).
func windowStart(snaps []Snapshot, d time.Duration) int {
	newest := snaps[len(snaps)-1].Time
	for i := len(snaps) - 2; i >= 0; i-- {
		if newest.Sub(snaps[i].Time) >= d {
			return i
		}
	}
	return 0
}
