package bottleneck

import (
	"cmp"
	"fmt"
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
// fast worker are not all stragglers); its slowdown is that ratio. Only workers that completed at least StragglerMinSteps
// steps in the window are compared, and at least two of them must have.
const (
	StragglerSlowdown = 1.5
	StragglerMinSteps = 3
)

// WorkerTime is one worker's work over a window: the input of
// [FindStragglers].
type WorkerTime struct {
	Task string
	// Steps is how many steps' passes it completed in the window.
	Steps float64
	// OwnSeconds is its compute and push time in the window, summed.
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
// one window and returns the stragglers, slowest first (nil: none).
func FindStragglers(ws []WorkerTime) []Straggler {
	type own struct {
		task string
		per  float64
	}
	var owns []own
	for _, w := range ws {
		if w.Steps >= StragglerMinSteps && w.OwnSeconds > 0 {
			owns = append(owns, own{w.Task, w.OwnSeconds / w.Steps})
		}
	}
	if len(owns) < 2 {
		return nil
	}
	var out []Straggler
	others := make([]float64, 0, len(owns)-1)
	for i, o := range owns {
		others = others[:0]
		for j, p := range owns {
			if j != i {
				others = append(others, p.per)
			}
		}
		m := upperMedian(others)
		if k := o.per / m; k >= StragglerSlowdown {
			out = append(out, Straggler{Task: o.task, Slowdown: k, OwnStepSeconds: o.per, OthersStepSeconds: m})
		}
	}
	slices.SortStableFunc(out, func(a, b Straggler) int { return cmp.Compare(b.Slowdown, a.Slowdown) })
	return out
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

// workerTimes are the workers' figures for FindStragglers.
func workerTimes(order []*taskState) []WorkerTime {
	var out []WorkerTime
	for _, st := range order {
		if st.role != RoleWorker {
			continue
		}
		out = append(out, WorkerTime{
			Task:       st.target.Task,
			Steps:      st.inc[keyPhaseCount+metrics.PhaseCompute],
			OwnSeconds: st.inc[keyPhaseSum+metrics.PhaseCompute] + st.inc[keyPhaseSum+metrics.PhasePush],
		})
	}
	return out
}
