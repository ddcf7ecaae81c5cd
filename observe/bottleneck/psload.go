package bottleneck

import (
	"fmt"
	"strings"
	"time"
)

// PSLoad is what a window of scrapes says of one parameter server's
// load (docs/elastic.md, "Rebalancing"): the parameters it holds, the
// gradients the workers pushed it and the seconds they waited for its
// answers to their pushes and pulls (pstrain_worker_shard_rpc_seconds,
// summed over the workers).
type PSLoad struct {
	Task    string
	Params  int
	Pushes  float64
	Seconds float64
}

// PSLoads is the load of each PS target up in the newest snapshot over
// the window from the most recent snapshot at least d older than the
// newest (or the oldest) to the newest, shortened to the snapshots where
// each of those PS was up and held the parameters it holds now (the
// current layout: not the start-up, nor the layout before a change; a
// PS a change took out, down since, does not count). It fails when no two
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
	for _, t := range last.Tasks {
		if t.Target.role() != RolePS || !t.Up {
			continue
		}
		_, shard, _ := strings.Cut(t.Target.Task, "/")
		l, err := psLoadOf(first, last, shard)
		if err != nil {
			return nil, err
		}
		l.Task, l.Params = t.Target.Task, int(t.Reading.Gauges[keyShardParams])
		out = append(out, l)
	}
	return out, nil
}

// sameLayout says every PS task up in b was up in a and held the same
// parameters in both.
func sameLayout(a, b Snapshot) bool {
	for i, t := range b.Tasks {
		if t.Target.role() != RolePS || !t.Up {
			continue
		}
		x := a.Tasks[i]
		if !x.Up || x.Reading.Gauges[keyShardParams] != t.Reading.Gauges[keyShardParams] {
			return false
		}
	}
	return true
}

// psLoadOf is the pushes to shard between snapshots a and b, and the
// seconds they took, over the workers up in both.
func psLoadOf(a, b Snapshot, shard string) (PSLoad, error) {
	var l PSLoad
	for i, t := range b.Tasks {
		x := a.Tasks[i]
		if t.Target.role() != RoleWorker || !t.Up || !x.Up {
			continue
		}
		n := t.Reading.Counters[keyPushCount+shard] - x.Reading.Counters[keyPushCount+shard]
		sec := t.Reading.Counters[keyShardSum+shard] - x.Reading.Counters[keyShardSum+shard]
		if n < 0 || sec < 0 {
			return PSLoad{}, fmt.Errorf("%s restarted in the window", t.Target.Task)
		}
		l.Pushes += n
		l.Seconds += sec
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
