package ps

import (
	"math"
	"slices"

	"github.com/pstrain/pstrain/ml/vec"
)

// The norm guard's fixed settings (docs/security.md, "The divergence
// guard"). The multiple K is the run's --norm-guard.
const (
	// GuardWindow is how many accepted gradient norms the guard's median
	// is taken over, and its warm-up: no gradient is judged before that
	// many norms are known.
	GuardWindow = 32
	// GuardFloorRMS is the floor of the reference norm, as a root mean
	// square per element: the reference is at least GuardFloorRMS*sqrt(n)
	// for a shard of n parameters, so that tiny early norms do not make
	// ordinary ones look huge.
	GuardFloorRMS = 1e-5
	// OutlierRatio is the ratio beyond which a gradient is called an
	// outlier when the guard refuses nothing (--norm-guard 0): it is still
	// recorded against its worker, to name a suspect if the model
	// diverges.
	OutlierRatio = 100
)

// NormGuard judges a shard's gradients by their L2 norm: a gradient whose
// norm is more than K times the reference, the median of the last
// GuardWindow accepted norms (but at least the floor), is refused. Until
// GuardWindow norms are known it judges nothing. It is a plain value
// with no clock or I/O; the Shard feeds it.
//
// The median of a window is robust: an attacker whose gradients are a
// minority of the window's cannot move it far, and a single huge
// gradient, being refused, never enters it.
type NormGuard struct {
	k      float64   // refuse beyond k x reference; 0: judge but never refuse
	floor  float64   // the reference's lower bound
	window []float64 // the last accepted norms, a ring
	vers   []int64   // the version each of window's gradients came from
	next   int       // where the next accepted norm goes
	ref    float64   // the reference: max(median(window), floor); 0 while warming up
	scr    []float64 // scratch for the median
}

// NewNormGuard returns a guard that refuses norms beyond k times the
// reference (k 0: never), with the reference at least floor.
func NewNormGuard(k, floor float64) *NormGuard {
	return &NormGuard{k: k, floor: floor, window: make([]float64, 0, GuardWindow), vers: make([]int64, 0, GuardWindow),
		scr: make([]float64, GuardWindow)}
}

// Verdict is the guard's judgement of one gradient.
type Verdict struct {
	// Ratio is the norm over the reference (+Inf for a non-finite
	// gradient); 0 while the guard warms up.
	Ratio  float64
	Refuse bool
}

// Judge rates a gradient of the given L2 norm. It changes nothing: call
// Accept with the norms of the gradients that are applied.
func (g *NormGuard) Judge(norm float64) Verdict {
	if g.ref == 0 {
		return Verdict{}
	}
	r := norm / g.ref
	return Verdict{Ratio: r, Refuse: g.k > 0 && r > g.k}
}

// Accept adds the norm of an applied gradient to the window.
func (g *NormGuard) Accept(norm float64) { g.AcceptAt(norm, 0) }

// AcceptAt is Accept of a gradient computed from version.
func (g *NormGuard) AcceptAt(norm float64, version int64) {
	if len(g.window) < cap(g.window) {
		g.window = append(g.window, norm)
		g.vers = append(g.vers, version)
	} else {
		g.window[g.next] = norm
		g.vers[g.next] = version
	}
	g.next = (g.next + 1) % cap(g.window)
	g.update()
}

// update recomputes the reference once the window is full.
func (g *NormGuard) update() {
	if len(g.window) < cap(g.window) {
		g.ref = 0
		return
	}
	s := g.scr[:len(g.window)]
	copy(s, g.window)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + med) / 2
	}
	g.ref = max(med, g.floor)
}

// Inherit takes over the part of prev's window of accepted norms that
// belongs to the restored model's past: the norms of gradients computed
// from versions up to upTo, the version the shard is re-initialised at
// (a rollback, or a restore after another shard failed). A shard
// restored to a model it had already trained past is then not left
// without a guard for a warm-up an attacker could time its gradients
// for, and norms of a model that went on to be ruined (and were
// thrown away with it) never make the restored model's honest
// gradients look small: the reference restarts from the restored
// model's own history. With fewer than GuardWindow such norms the
// guard warms up again from them.
func (g *NormGuard) Inherit(prev *NormGuard, upTo int64) {
	g.window, g.vers, g.next = g.window[:0], g.vers[:0], 0
	n := len(prev.window)
	for i := range n {
		k := i
		if n == cap(prev.window) {
			k = (prev.next + i) % n // oldest first
		}
		if prev.vers[k] <= upTo {
			g.window = append(g.window, prev.window[k])
			g.vers = append(g.vers, prev.vers[k])
		}
	}
	g.next = len(g.window) % cap(g.window)
	g.update()
}

// Reference is the norm ratios are taken against (0 while warming up).
func (g *NormGuard) Reference() float64 { return g.ref }

// sumSquares is the sum of x's squares in float64, NaN or +Inf if x holds
// a NaN or an Inf (and only then), so one pass both checks a gradient is
// finite and gives its norm (vec.SumSquares: with AVX2, 16 values an
// iteration).
func sumSquares(x []float32) float64 { return vec.SumSquares(x) }

// isFinite reports whether x is neither NaN nor infinite.
func isFinite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
