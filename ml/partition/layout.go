package partition

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/ml/model"
)

// Layout names a plan of a run's model: how many parameter servers hold
// it and, after a rebalance (rebalance.go), each one's weight. Every
// process that needs the plan (chief, shards, workers, a checkpoint's
// reader) computes it from the layout, so the layout is all that travels
// and is stored.
type Layout struct {
	PS int
	// Weights are the shards' weights (Weighted), or nil: even (New).
	Weights []int
}

// Even is the layout of n shards of equal weight.
func Even(n int) Layout { return Layout{PS: n} }

// LayoutOf is the layout of n shards with weights (nil or of another
// length than n: even), as a message or a manifest carries them.
func LayoutOf[T int | int32](n int, weights []T) Layout {
	if len(weights) != n || n < 1 {
		return Even(n)
	}
	l := Layout{PS: n, Weights: make([]int, n)}
	for i, w := range weights {
		l.Weights[i] = int(w)
	}
	return l.normal()
}

// MaxWeight bounds a shard's weight. Weights are proportions (a
// rebalance's sum to about WeightScale); the bound keeps a weight in an
// int32 on the wire and its products with row counts in an int.
const MaxWeight = 1_000_000

// normal is l with equal weights written as none.
func (l Layout) normal() Layout {
	if len(l.Weights) > 0 && slices.Min(l.Weights) == slices.Max(l.Weights) {
		l.Weights = nil
	}
	return l
}

// Plan is the partition of spec the layout names. It refuses weights
// that are not one per shard, each in [1, MaxWeight].
func (l Layout) Plan(spec model.Spec) (Plan, error) {
	if l.Weights == nil {
		return New(spec, l.PS)
	}
	if len(l.Weights) != l.PS {
		return Plan{}, fmt.Errorf("partition: %d weights for %d shards", len(l.Weights), l.PS)
	}
	if lo, hi := slices.Min(l.Weights), slices.Max(l.Weights); lo < 1 || hi > MaxWeight {
		return Plan{}, fmt.Errorf("partition: weights %v: each must be in [1, %d]", l.Weights, MaxWeight)
	}
	return Weighted(spec, l.Weights)
}

// Equal says l and o name the same plan: the same count, and weights in
// the same proportions (1:2 and 2:4), or both even.
func (l Layout) Equal(o Layout) bool {
	a, b := l.normal().Weights, o.normal().Weights
	if l.PS != o.PS || len(a) != len(b) {
		return false
	}
	var sa, sb int64
	for i := range a {
		sa, sb = sa+int64(a[i]), sb+int64(b[i])
	}
	for i := range a {
		if int64(a[i])*sb != int64(b[i])*sa {
			return false
		}
	}
	return true
}

// Weights32 is the layout's weights as a message carries them (nil:
// even).
func (l Layout) Weights32() []int32 {
	var out []int32
	for _, w := range l.normal().Weights {
		out = append(out, int32(w))
	}
	return out
}

// String is "2", or "2 weighted 323:677".
func (l Layout) String() string {
	w := l.normal().Weights
	if w == nil {
		return strconv.Itoa(l.PS)
	}
	parts := make([]string, len(w))
	for i, x := range w {
		parts[i] = strconv.Itoa(x)
	}
	return fmt.Sprintf("%d weighted %s", l.PS, strings.Join(parts, ":"))
}
