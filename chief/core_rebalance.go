package chief

import (
	"fmt"
	"time"

	"github.com/pstrain/pstrain/ml/partition"
)

// Rebalancing (docs/elastic.md, "Rebalancing"): a layout change that
// keeps the PS count and gives the shards other weights
// (partition.Weighted), asked for by Rebalance with weights the launcher
// measured (partition.PlanRebalance). It takes the way of a change of
// the count (core_psscale.go): hold, snapshot, workers switch, the
// shards are initialised on the new layout from the snapshot. The
// layout's weights are kept in the state (a restarted chief keeps them)
// and in every checkpoint's manifest written after (a checkpoint of a
// rebalanced layout reads back onto any layout); a change of the count
// goes back to equal shares, and so does a run resumed from a
// checkpoint (its --ps, evenly).

// KindRebalance is report.MembershipChange.Kind of a rebalance.
const KindRebalance = "rebalance"

// Rebalance asks for the layout of the PS count in effect with weights
// (one per shard), measured imbalance ago; it takes effect as a change
// of the count does. It refuses what ScalePS refuses, weights that do
// not fit the count, and a rebalance while a change of the count is
// asked for or under way.
func (c *Core) Rebalance(weights []int, imbalance float64, now time.Time) error {
	if err := c.layoutRefusal(); err != nil {
		return err
	}
	if len(c.p.Spec.Tables()) > 0 {
		// Weights move the dense row blocks only: a key's row is on
		// shard embed.ShardOf(table, key, PS count), whatever the weights.
		return fmt.Errorf("%w: a %s model's embedding rows are placed by a hash of their key, which weights do not change; change the PS count instead (--ps)", ErrScale, c.p.Spec.KindName())
	}
	to := partition.LayoutOf(c.psCount, weights)
	switch {
	case c.psTarget != c.psCount || c.psChange != nil && c.psChange.to != c.psCount:
		return fmt.Errorf("%w: a change of the PS count is under way", ErrScale)
	case len(weights) != c.psCount:
		return fmt.Errorf("%w: %d weights for %d parameter servers (the layout changed since they were measured?)", ErrScale, len(weights), c.psCount)
	case to.Equal(c.targetLayout()):
		return nil
	}
	if _, err := to.Plan(c.p.Spec); err != nil {
		return fmt.Errorf("%w: %v", ErrScale, err)
	}
	c.log.Info("rebalance asked", "layout", to.String(), "now", c.layout().String(), "imbalance", fmt.Sprintf("%.2f", imbalance))
	c.setPSTarget(c.psCount, to.Weights, imbalance, now)
	return nil
}

// setPSTarget makes n shards with weights (nil: even) the layout asked
// for, measured imbalance ago (0: not measured), at now; a change not
// held yet takes the new target instead.
func (c *Core) setPSTarget(n int, weights []int, imbalance float64, now time.Time) {
	c.psTarget, c.psTargetWeights, c.psImbalance, c.psAskedAt = n, weights, imbalance, now
	c.st.PSAsked = &AskedLayout{PS: n, Weights: weights, Imbalance: imbalance, AskedUnix: float64(now.UnixNano()) / 1e9}
	if ch := c.psChange; ch != nil && ch.at == 0 {
		ch.to, ch.weights, ch.imbalance, ch.asked = n, weights, imbalance, now
	}
}

// movedParameters is the parameters a change from old to new carries
// between parameter servers (0 if a plan cannot be made).
func (c *Core) movedParameters(old, new partition.Layout) int {
	a, err1 := old.Plan(c.p.Spec)
	b, err2 := new.Plan(c.p.Spec)
	if err1 != nil || err2 != nil {
		return 0
	}
	return partition.MovedElements(partition.Moves(a, b))
}
