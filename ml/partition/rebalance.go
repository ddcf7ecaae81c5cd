package partition

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Rebalancing (docs/elastic.md, "Rebalancing"): a parameter server
// slower than the others (fewer CPU cycles, or a core shared with more
// processes) keeps the workers longer at every step, and in sync every
// step waits for the slowest shard. Its load is measured as the mean
// wall-clock seconds the workers wait on it per gradient they push it:
// the push and the pull that follows, from sending each to its answer
// (pstrain_worker_shard_rpc_seconds). A shard's CPU seconds per step do
// not show it (a throttled process needs as many cycles, it only gets
// them later), and neither does the time its handlers take (a throttled
// process is mostly stopped between requests, which then wait for it):
// the time the workers wait does. A shard's speed is the parameters it
// holds over that time; the new layout gives each shard weight in
// proportion to its speed, so that each keeps the workers as long. The
// time includes what every shard costs alike (the barrier, the worker's
// own encoding), which dilutes the imbalance: one rebalance moves part
// of the way, and asking again measures the new layout and moves more.

// Load is what a window of one shard's metrics says of it.
type Load struct {
	// Params is the parameters the shard holds (its layout's share).
	Params int
	// Pushes is the gradients the workers pushed it over the window,
	// Seconds the wall-clock time they waited on it (their pushes to it
	// and pulls from it).
	Pushes  float64
	Seconds float64
}

// PushSeconds is the mean seconds the workers waited on the shard per
// gradient they pushed it.
func (l Load) PushSeconds() float64 {
	if l.Pushes <= 0 {
		return 0
	}
	return l.Seconds / l.Pushes
}

// Rebalancing's constants.
const (
	// WeightScale is the sum the weights of a rebalanced layout come
	// near: per-mille shares.
	WeightScale = 1000
	// MinPushes is the fewest gradients a shard must have taken in over
	// the window for its time to count.
	MinPushes = 20
	// MinImbalance is the least ratio of the slowest shard's seconds per
	// gradient to the fastest's that a rebalance acts on: below it the
	// shards take as long within what a loaded host's noise makes of
	// equal shards (1.01 and 1.07 measured on 2 cores at load 10; one
	// of 2 shards held to a third of a core, 1.44-1.76).
	MinImbalance = 1.25
)

// Refusals of PlanRebalance.
var (
	ErrUnmeasured = errors.New("the shards' load cannot be measured")
	ErrBalanced   = errors.New("no measurable imbalance")
)

// Rebalance is a decision to rebalance: the new layout's weights and the
// measured imbalance that called for it.
type Rebalance struct {
	Weights []int
	// Imbalance is the slowest shard's seconds per gradient over the
	// fastest's (a gradient's push and the pull after it).
	Imbalance float64
}

// PlanRebalance decides from the shards' loads (by shard index) whether
// to rebalance and with which weights: each shard's weight is its speed
// (parameters per second of push time) as a share of WeightScale, at
// least a tenth of an even share (a shard however slow keeps rows: taking
// a PS out is `pstrain scale --ps`, and a weight near 0 could leave a
// shard no row of a small model). It refuses with ErrUnmeasured when a shard took in fewer than
// MinPushes gradients or none of its time was measured, and with
// ErrBalanced when the imbalance is below minImbalance. It is a pure
// function of its arguments.
func PlanRebalance(loads []Load, minImbalance float64) (Rebalance, error) {
	if len(loads) < 2 {
		return Rebalance{}, fmt.Errorf("%w: a run with %d parameter server has nothing to rebalance", ErrBalanced, len(loads))
	}
	speeds := make([]float64, len(loads))
	lo, hi, total := math.Inf(1), 0.0, 0.0
	for i, l := range loads {
		t := l.PushSeconds()
		if l.Pushes < MinPushes || t <= 0 || l.Params <= 0 {
			return Rebalance{}, fmt.Errorf("%w: ps/%d took in %.0f gradients over the window (at least %d needed)", ErrUnmeasured, i, l.Pushes, MinPushes)
		}
		lo, hi = min(lo, t), max(hi, t)
		speeds[i] = float64(l.Params) / t
		total += speeds[i]
	}
	r := Rebalance{Imbalance: hi / lo}
	if r.Imbalance < minImbalance {
		return Rebalance{}, fmt.Errorf("%w: the slowest shard keeps the workers %.2fx as long as the fastest per step (%s), below %.2fx",
			ErrBalanced, r.Imbalance, DescribeLoads(loads), minImbalance)
	}
	r.Weights = make([]int, len(loads))
	for i, s := range speeds {
		r.Weights[i] = max(WeightScale/(10*len(loads)), 1, int(math.Round(WeightScale*s/total)))
	}
	return r, nil
}

// DescribeLoads is the shards' loads for a person: "ps/0 2.10 ms per
// step of 318010 parameters, ps/1 0.70 ms per step of 318000".
func DescribeLoads(loads []Load) string {
	parts := make([]string, len(loads))
	for i, l := range loads {
		parts[i] = fmt.Sprintf("ps/%d %.2f ms per step of %d parameters", i, 1e3*l.PushSeconds(), l.Params)
	}
	return strings.Join(parts, ", ")
}
