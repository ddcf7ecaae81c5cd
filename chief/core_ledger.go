package chief

import (
	"slices"

	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
)

// The data ledger (docs/recovery.md, "Data positions"): where exactly
// once per epoch cannot hold, the samples read twice into the model or
// skipped, by global data epoch. The core counts
//
//   - the shards' gaps (ps.Shard.Gaps, in every poll's answer): runs of a
//     worker's batches a shard's position jumped over, whose gradients
//     that shard's slice of the model does not hold while another's
//     does: a backup worker's gradient one shard dropped as stale and
//     another counted, a catch-up, an async or ssp shard restored from a
//     checkpoint while the others went on (the batches from the
//     checkpoint's positions to where the workers were). Skipped;
//   - a restore of every shard (a sync PS restore, a rollback) after a
//     scale-down: every worker goes back to its checkpoint position and
//     reads its batches again, but a removed worker does not: its
//     batches from its checkpoint position to the end of its eras are
//     skipped.

// ckptKept is how many checkpoints' positions the core keeps (a
// rollback may go back further: its ledger is then not counted).
const ckptKept = 8

// noteGaps adds the gaps each answering shard reports that the ledger
// has not counted yet (a shard's list starts afresh with each Init,
// which a new generation says).
func (c *Core) noteGaps(shards []ShardStatus) {
	if len(c.gapsSeen) < len(shards) {
		c.gapsSeen = make([][2]int64, len(shards))
	}
	for s, x := range shards {
		if x.Err != nil || !x.Serving {
			continue
		}
		seen := &c.gapsSeen[s]
		if seen[0] != x.Generation || int64(len(x.Gaps)) < 3*seen[1] {
			seen[0], seen[1] = x.Generation, 0
		}
		fresh := x.Gaps[3*seen[1]:]
		seen[1] = int64(len(x.Gaps) / 3)
		for i := 0; i+2 < len(fresh); i += 3 {
			w := int(fresh[i])
			from, to := make([]int64, w+1), make([]int64, w+1)
			from[w], to[w] = fresh[i+1], fresh[i+2]
			c.addLedger(lostSamples(c.st.Plan, from, to), "a shard's position jumped over a worker's batches", "ps", s, "worker", w, "from", from[w], "to", to[w])
		}
	}
}

// addLedger adds lost to the ledger and logs why.
func (c *Core) addLedger(lost []report.LedgerEntry, why string, args ...any) {
	if len(lost) == 0 {
		return
	}
	c.st.Ledger = mergeLedger(c.st.Ledger, lost)
	c.log.Warn("data ledger: samples skipped: "+why, append(args, "epochs", lost)...)
}

// noteCheckpointPositions records a committed checkpoint's positions.
func (c *Core) noteCheckpointPositions(step int64, pos []int64) {
	if pos == nil {
		return
	}
	if c.ckptPos == nil {
		c.ckptPos = map[int64][]int64{}
	}
	c.ckptPos[step] = pos
	if len(c.ckptPos) > ckptKept {
		delete(c.ckptPos, slices.Min(slicesKeys(c.ckptPos)))
	}
}

func slicesKeys(m map[int64][]int64) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// ledgerRestore counts what restoring shards from the checkpoint of
// step leaves unread: when every shard is restored, the removed
// workers' batches past their checkpoint positions (see above). (A
// restore of some shards shows in their gaps.)
func (c *Core) ledgerRestore(shards []int, step int64) {
	ends := c.retiredEnds()
	if len(shards) < len(c.versions) || len(ends) == 0 {
		return
	}
	from, ok := c.ckptPos[step]
	if !ok && step > 0 {
		c.log.Warn("data ledger: the restored checkpoint's data positions are not known; the removed workers' batches it leaves unread are not counted", "step", step)
		return
	}
	c.addLedger(lostSamples(c.st.Plan, from, ends), "removed workers do not read again what the restore undid", "from_step", step)
}

// retiredEnds is, for every removed worker, the end of its eras (where
// a restore of every shard leaves it behind), and 0 for the others
// (they read their batches again); nil without removed workers.
func (c *Core) retiredEnds() []int64 {
	var out []int64
	for w := range c.retired {
		end, ok := c.st.Plan.Ends(w)
		if !ok {
			continue
		}
		for len(out) <= w {
			out = append(out, 0)
		}
		out[w] = end
	}
	return out
}

// lostSamples is, by global epoch, the samples of the batches between
// each worker's position in from and in to (none where to is not
// past from).
func lostSamples(plan dataset.DataPlan, from, to []int64) []report.LedgerEntry {
	by := map[int64]int64{}
	for w, end := range to {
		var start int64
		if w < len(from) {
			start = from[w]
		}
		for p := start; p < end; p++ {
			if _, e, _, ok := plan.Locate(w, p); ok {
				by[e] += int64(plan.Batch)
			}
		}
	}
	var out []report.LedgerEntry
	for e, n := range by {
		out = append(out, report.LedgerEntry{Epoch: e, Skipped: n})
	}
	slices.SortFunc(out, func(a, b report.LedgerEntry) int { return int(a.Epoch - b.Epoch) })
	return out
}

// mergeLedger adds more to l, epoch by epoch, in epoch order.
func mergeLedger(l, more []report.LedgerEntry) []report.LedgerEntry {
	out := slices.Clone(l)
	for _, m := range more {
		i := slices.IndexFunc(out, func(e report.LedgerEntry) bool { return e.Epoch == m.Epoch })
		if i < 0 {
			out = append(out, m)
			continue
		}
		out[i].ReadTwice += m.ReadTwice
		out[i].Skipped += m.Skipped
	}
	slices.SortFunc(out, func(a, b report.LedgerEntry) int { return int(a.Epoch - b.Epoch) })
	return out
}
