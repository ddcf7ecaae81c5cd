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
// to the newest, shortened to the snapshots where every PS was up and
// held the parameters it holds now (the current layout: not the
// start-up, nor the layout before a change). It fails when no two
// snapshots are left, or a PS restarted in the window (a counter went
// back).
func (m *Monitor) PSLoads(d time.Duration) ([]PSLoad, error) {
	m.mu.Lock()
	snaps := m.snaps
	m.mu.Unlock()
	if len(snaps) < 2 {
		return nil, ErrTooFewSnapshots
	}
	last := snaps[len(snaps)-1]
	start := windowStart(snaps, d)
	for start < len(snaps)-1 && !sameLayout(snaps[start], last) {
		start++
	}
	if start == len(snaps)-1 {
		return nil, fmt.Errorf("%w of the parameter servers' current layout", ErrTooFewSnapshots)
	}
	first := snaps[start]
	var out []PSLoad
	for i, t := range last.Tasks {
		if t.Target.role() != RolePS {
			continue
		}
		l, err := psLoadOf(t.Target.Task, first.Tasks[i].Reading, t.Reading)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// sameLayout says every PS task was up in a and b and held the same
// parameters in both.
func sameLayout(a, b Snapshot) bool {
	for i, t := range b.Tasks {
		if t.Target.role() != RolePS {
			continue
		}
		x := a.Tasks[i]
		if !x.Up || !t.Up || x.Reading.Gauges[keyShardParams] != t.Reading.Gauges[keyShardParams] {
			return false
		}
	}
	return true
}

// psLoadOf is task's load between readings a and b.
func psLoadOf(task string, a, b Reading) (PSLoad, error) {
	l := PSLoad{Task: task, Params: int(b.Gauges[keyShardParams]), Pushes: b.Counters[keyPushCount] - a.Counters[keyPushCount],
		Seconds: b.Counters[keyPushSum] - a.Counters[keyPushSum]}
	if l.Pushes < 0 || l.Seconds < 0 {
		return PSLoad{}, fmt.Errorf("%s restarted in the window", task)
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
