package ps

import (
	"math"
	"slices"
	"time"

	"github.com/pstrain/pstrain/config"
)

// The worker's side of the sync protocol: which answers of the shards a
// step may use. The shards (Shard) decide what a gradient does; Align
// decides, from what the pulls answered, whether a worker computes its
// step, pulls some shards again, pushes a catch-up gradient, or stops.
// It is pure (no I/O, no clock); worker.Core applies it to each pull
// round's answers.

// CatchUpAfter is how long a worker waits for a shard that is behind the
// others (in the newest generation) to reach their version before it
// calls the shard stalled and pushes it a catch-up gradient (see Align).
// The normal lag is one push in flight, a few milliseconds.
const CatchUpAfter = 300 * time.Millisecond

// PullView is what a worker's latest pull of one shard answered.
type PullView struct {
	Version    int64 // the version of the parameters it answered with
	Generation int64 // the chief's generation of the shard's state
	Done       bool  // training is over
	// Stalled says that the last pull was bounded (Pull.Bounded) and the
	// shard did not reach the version asked for within the bound: it
	// answered nothing, so Version is still the older one.
	Stalled bool
}

// Pull asks one shard again, for MinVersion.
type Pull struct {
	Shard      int
	MinVersion int64
	// Bounded: wait at most CatchUpAfter, then report the shard Stalled.
	// Otherwise wait as long as it takes.
	Bounded bool
}

// Action is what a worker does next.
type Action int

// What Align can decide.
const (
	// AlignStep: the answers are one version of every shard, in one
	// generation (sync), or whatever they are (async, ssp): compute the
	// step on them and push every shard its slice.
	AlignStep Action = iota
	// AlignPull: pull the shards in Alignment.Pulls again, then Align
	// again with their new answers.
	AlignPull
	// AlignCatchUp: compute a gradient on the parameters at hand and push
	// it only to the shards in Alignment.CatchUp, each tagged with the
	// version and generation it answered with; then pull every shard at
	// Alignment.Version and Align again.
	AlignCatchUp
	// AlignDone: a shard said training is over.
	AlignDone
)

func (a Action) String() string {
	switch a {
	case AlignStep:
		return "step"
	case AlignPull:
		return "pull"
	case AlignCatchUp:
		return "catch-up"
	case AlignDone:
		return "done"
	}
	return "unknown"
}

// Alignment is Align's decision.
type Alignment struct {
	Action Action
	// Version is, in sync mode, the highest version in the newest
	// generation: the step's version (AlignStep), the one the lagging
	// shards are asked for (AlignPull) or the one every shard is pulled at
	// after a catch-up (AlignCatchUp). 0 in async and ssp mode.
	Version int64
	Pulls   []Pull // AlignPull: the shards to pull again, by shard
	CatchUp []int  // AlignCatchUp: the shards to push a catch-up gradient to
}

// Align is the rule by which a worker decides what to do with its
// pulls' answers, views[s] being shard s's (see PullView):
//
//   - A shard that says done ends the step (AlignDone), in every mode:
//     with backup workers the shards aggregate independently, so another
//     shard may be waiting for a step no worker will complete.
//   - async and ssp: the answers are used as they are (AlignStep); there
//     is nothing to align.
//   - sync: a step uses one version of every shard, in one generation,
//     or its gradient would mix two models. Let g be the newest
//     generation answered and hi the highest version answered in g.
//     A shard in an older generation is pulled again with an unreachable
//     minimum version (math.MaxInt64): the chief rolls every shard back
//     together, and a pull from an older generation answers at once when
//     the shard's generation changes. A shard in g behind hi is pulled
//     again at hi, bounded (Pull.Bounded): normally it is one push in
//     flight away. When every shard is in g at hi, the step goes ahead
//     (AlignStep, Version hi).
//   - sync, catch-up: a shard in g behind hi that did not reach hi within
//     the bound (Stalled) is missing a gradient that may never come. The
//     shard at hi completed step hi-1 with gradients tagged hi-1 that
//     were pushed to every shard, so the lagging shard gets all of them
//     but those of a worker that died between its pushes. A restarted
//     incarnation of that worker that registered again before the
//     chief's heartbeat timeout is counted live, so the step waits for
//     it, and the workers that contributed wait at hi for good. So when
//     every shard is in g (no rollback under way) the worker pushes the
//     stalled shards a gradient computed on the parameters it has, tagged
//     with their versions (AlignCatchUp): from a worker that already
//     contributed to the step it is a duplicate and dropped, from the new
//     incarnation (or a backup worker whose last gradient was stale) it
//     completes the step. Only workers that see the lag push one: those
//     whose pulls answered with a lower version than another shard's, not
//     those blocked at hi, who contributed. With a rollback under way the
//     stalled shards are pulled again (bounded) until it is over.
//
// Shards never get more than one step apart in sync mode: a shard can
// only reach v+1 from gradients tagged v, which are computed from
// parameters at v on every shard (or, for a catch-up, pushed to a shard
// at v). Pulls are listed by shard.
func Align(mode config.Mode, views []PullView) Alignment {
	if slices.ContainsFunc(views, func(v PullView) bool { return v.Done }) {
		return Alignment{Action: AlignDone}
	}
	if mode != config.Sync {
		return Alignment{Action: AlignStep}
	}
	g, hi := newest(views)
	a := Alignment{Action: AlignStep, Version: hi}
	rollback := false
	for s, v := range views {
		switch {
		case v.Generation < g:
			rollback = true
			a.Pulls = append(a.Pulls, Pull{Shard: s, MinVersion: math.MaxInt64})
		case v.Version < hi && v.Stalled:
			a.CatchUp = append(a.CatchUp, s)
		case v.Version < hi:
			a.Pulls = append(a.Pulls, Pull{Shard: s, MinVersion: hi, Bounded: true})
		}
	}
	switch {
	case len(a.CatchUp) > 0 && !rollback:
		// A shard that is merely slow (every lagging shard was pulled with
		// the same bound, so each either answered or stalled) is pulled
		// again with the others after the catch-up.
		a.Action, a.Pulls = AlignCatchUp, nil
	case len(a.CatchUp) > 0:
		for _, s := range a.CatchUp {
			a.Pulls = append(a.Pulls, Pull{Shard: s, MinVersion: hi, Bounded: true})
		}
		slices.SortFunc(a.Pulls, func(x, y Pull) int { return x.Shard - y.Shard })
		a.Action, a.CatchUp = AlignPull, nil
	case len(a.Pulls) > 0:
		a.Action = AlignPull
	}
	return a
}

// newest returns the newest generation in views and the highest version
// answered in it.
func newest(views []PullView) (gen, hi int64) {
	gen, hi = math.MinInt64, -1
	for _, v := range views {
		switch {
		case v.Generation > gen:
			gen, hi = v.Generation, v.Version
		case v.Generation == gen:
			hi = max(hi, v.Version)
		}
	}
	return gen, hi
}
