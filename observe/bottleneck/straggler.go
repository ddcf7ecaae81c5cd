package bottleneck

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/pstrain/pstrain/observe/metrics"
)

// The straggler rule (docs/observability.md, "Stragglers"). A worker's
// own time per step is its compute and push time per step: the part of
// a step no other worker can make it wait for (a sync pull is held at the
// shards until every gradient of the step is in, an SSP pull while the
// worker is too far ahead of the slowest; an async pull is not held, but
// its time is mostly the shards' and the network's). A worker is a
// straggler over a window when its own time per step is at least
// StragglerSlowdown times the median of the other workers' (with an even
// number of others, the larger of the two middle ones: it must be that
// much slower than at least half of the others, so the others of one
// fast worker are not all stragglers); its slowdown is that ratio.
//
// It must also be that much slower in at least half of the window's
// slices (the time between two consecutive scrapes, a second in
// `pstrain run`) in which it was compared, so that a worker that stalled
// once (a burst of load on its host) is not named while the stall is in
// the window: a stall of 2 s leaves a 5 s window's mean 2x, but only the
// seconds of the stall slower. In a slice or a window, only workers that
// completed at least StragglerMinSteps steps are compared, and at least
// two of them must have.
const (
	StragglerSlowdown = 1.5
	StragglerMinSteps = 3
)

// WorkerTime is one worker's work over a window or a slice of it: the
// input of [FindStragglers].
type WorkerTime struct {
	Task string
	// Steps is how many steps' passes it completed.
	Steps float64
	// OwnSeconds is its compute and push time, summed.
	OwnSeconds float64
}

// Straggler is a worker slower than the others over a window.
type Straggler struct {
	Task string `json:"task"`
	// Slowdown is its own time per step over the (upper) median of the
	// other workers' (2.9: 2.9 times slower).
	Slowdown float64 `json:"slowdown"`
	// OwnStepSeconds is its own (compute and push) time per step;
	// OthersStepSeconds the median of the other workers'.
	OwnStepSeconds    float64 `json:"own_step_seconds"`
	OthersStepSeconds float64 `json:"others_own_step_seconds"`
}

func (s Straggler) String() string {
	return fmt.Sprintf("%s is %.1fx slower than the others (compute and push %s a step against %s)",
		s.Task, s.Slowdown, ms(s.OwnStepSeconds), ms(s.OthersStepSeconds))
}

// ms renders seconds as milliseconds, e.g. "39 ms" or "1.2 ms".
func ms(s float64) string {
	if s < 0.01 {
		return fmt.Sprintf("%.1f ms", 1000*s)
	}
	return fmt.Sprintf("%.0f ms", 1000*s)
}

// FindStragglers applies the straggler rule to the workers' figures over
// a window and over the slices of it (none: the window alone decides),
// and returns the stragglers, slowest first (nil: none).
func FindStragglers(window []WorkerTime, parts [][]WorkerTime) []Straggler {
	var out []Straggler
	for _, s := range slowerThanOthers(window) {
		compared, slower := 0, 0
		for _, part := range parts {
			if p, ok := compare(s.Task, part); ok {
				compared++
				if p.Slowdown >= StragglerSlowdown {
					slower++
				}
			}
		}
		if 2*slower >= compared {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b Straggler) int { return cmp.Compare(b.Slowdown, a.Slowdown) })
	return out
}

// slowerThanOthers are the workers of ws at least StragglerSlowdown
// times slower than the others, in ws's order.
func slowerThanOthers(ws []WorkerTime) []Straggler {
	var out []Straggler
	for _, w := range ws {
		if s, ok := compare(w.Task, ws); ok && s.Slowdown >= StragglerSlowdown {
			out = append(out, s)
		}
	}
	return out
}

// compare is task's own time per step in ws against the (upper) median
// of the other workers'; false when task, or every other worker,
// completed fewer than StragglerMinSteps steps.
func compare(task string, ws []WorkerTime) (Straggler, bool) {
	var own float64
	var others []float64
	found := false
	for _, w := range ws {
		if w.Steps < StragglerMinSteps || w.OwnSeconds <= 0 {
			continue
		}
		per := w.OwnSeconds / w.Steps
		if w.Task == task {
			own, found = per, true
			continue
		}
		others = append(others, per)
	}
	if !found || len(others) == 0 {
		return Straggler{}, false
	}
	m := upperMedian(others)
	return Straggler{Task: task, Slowdown: own / m, OwnStepSeconds: own, OthersStepSeconds: m}, true
}

// median of xs (not empty); xs is sorted in place.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// upperMedian of xs (not empty) is the median, or with an even count the
// larger of the two middle values; xs is sorted in place.
func upperMedian(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// heldBack says whether the stragglers hold the other workers back: the
// shards hold pulls (sync or SSP: they export the barrier wait), and the
// workers that are not stragglers spend at least BarrierFraction of their
// step pulling, which then is mostly waiting for the stragglers'
// gradients (sync) or for them to catch up (SSP). The other workers'
// pull share is returned with it.
func heldBack(b Breakdown) (float64, bool) {
	if len(b.Stragglers) == 0 || b.BarrierWaitPerPullSeconds == nil {
		return 0, false
	}
	slow := map[string]bool{}
	for _, s := range b.Stragglers {
		slow[s.Task] = true
	}
	var sum float64
	n := 0
	for _, t := range b.Tasks {
		if t.Role == RoleWorker && t.Phases != nil && !slow[t.Task] {
			sum += t.Phases.Pull + t.Phases.BarrierWait + t.Phases.Wait
			n++
		}
	}
	if n == 0 {
		return 0, false
	}
	share := sum / float64(n)
	return share, share >= BarrierFraction
}

// workerTimes are the workers' figures over the window and over each
// slice of it, in time order, for FindStragglers.
func workerTimes(order []*taskState) (window []WorkerTime, parts [][]WorkerTime) {
	bySnap := map[int][]WorkerTime{}
	for _, st := range order {
		if st.role != RoleWorker {
			continue
		}
		window = append(window, WorkerTime{
			Task:       st.target.Task,
			Steps:      st.inc[keyPhaseCount+metrics.PhaseCompute],
			OwnSeconds: st.inc[keyPhaseSum+metrics.PhaseCompute] + st.inc[keyPhaseSum+metrics.PhasePush],
		})
		for i, w := range st.slices {
			bySnap[i] = append(bySnap[i], w)
		}
	}
	for _, i := range slices.Sorted(maps.Keys(bySnap)) {
		parts = append(parts, bySnap[i])
	}
	return window, parts
}

// ownTime is a task's work between two of its readings.
func ownTime(task string, prev, cur Reading) WorkerTime {
	inc := func(k string) float64 {
		p, ok1 := prev.Counters[k]
		c, ok2 := cur.Counters[k]
		if !ok1 || !ok2 {
			return 0
		}
		return increase(p, c)
	}
	return WorkerTime{Task: task, Steps: inc(keyPhaseCount + metrics.PhaseCompute),
		OwnSeconds: inc(keyPhaseSum+metrics.PhaseCompute) + inc(keyPhaseSum+metrics.PhasePush)}
}
