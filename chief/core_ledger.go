package chief

import (
	"slices"

	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
)

// The data ledger (docs/recovery.md, "Data positions"): where exactly
// once per epoch cannot hold, the samples read twice into the model or
// skipped, by global data epoch. The core counts what the positions
// tell it:
//
//   - a shard restored from a checkpoint while the others go on (async
//     and ssp without hot standbys): the workers go on from the other
//     shards' positions, so the restored slice of the model misses the
//     batches between the checkpoint's positions and theirs: skipped;
//   - a restore of every shard (a sync PS restore, a rollback) rewinds
//     every worker to the checkpoint and its batches are read again,
//     but a removed worker's (retired since) are not: the batches
//     between its checkpoint position and the end of its eras are
//     skipped.
//
// Backup workers (a batch one shard dropped as stale and another
// counted) are not counted: no shard knows what the others did with a
// gradient.

// ckptKept is how many checkpoints' positions the core keeps (a
// rollback may go back further: its ledger is then not counted).
const ckptKept = 8

// notePositions records the positions each answering shard holds.
func (c *Core) notePositions(shards []ShardStatus) {
	if len(c.shardPos) < len(shards) {
		c.shardPos = make([][]int64, len(shards))
	}
	for s, x := range shards {
		if x.Err == nil && x.Serving && x.Positions != nil {
			c.shardPos[s] = x.Positions
		}
	}
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
// step loses (see above).
func (c *Core) ledgerRestore(shards []int, step int64) {
	from, ok := c.ckptPos[step]
	if !ok && step > 0 {
		if c.shardPos != nil {
			c.log.Warn("data ledger: the restored checkpoint's data positions are not known; what the restore lost is not counted", "step", step)
		}
		return
	}
	var to []int64
	if len(shards) == len(c.versions) {
		to = c.retiredEnds()
	} else {
		to = c.othersPositions(shards)
	}
	lost := lostSamples(c.st.Plan, from, to)
	if len(lost) == 0 {
		return
	}
	c.st.Ledger = mergeLedger(c.st.Ledger, lost)
	c.log.Warn("data ledger: samples not in the model after the restore", "from_step", step, "epochs", lost)
}

// retiredEnds is, for every removed worker, the end of its eras (where
// a restore of every shard leaves it behind), and 0 for the others
// (they read their batches again).
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

// othersPositions is each worker's furthest position on the shards not
// restored (where the workers go on from).
func (c *Core) othersPositions(restored []int) []int64 {
	var out []int64
	for s, pos := range c.shardPos {
		if slices.Contains(restored, s) {
			continue
		}
		out = maxPositions(out, pos)
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
