package chief

import (
	"math"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/report"
)

// The data queue (docs/elastic.md, "The data queue"; dataset/queue.go):
// in async and ssp runs with --data-split queue (the default) every
// epoch is cut into chunks of a few batches that the core hands out in
// order, to each worker as it reads, so a slower worker reads less of
// each epoch and no epoch waits for it. A worker holds half a second of
// reading ahead: its heartbeats (and one it sends at once when it has
// read half of what it holds, or all) bring more. The chief saves its
// state before it answers with new chunks, so a restarted chief never
// hands a chunk out twice.

// leaseAhead is how long the chunks a worker holds unread should last
// at its measured rate: long enough for the heartbeat it sends once it
// has read half of them to bring more on a loaded machine, short enough
// that few are left unread when the run ends (or the worker dies).
const leaseAhead = 500 * time.Millisecond

// initialPlan is the data plan a run starts with: a queue in async and
// ssp runs with --data-split queue, else one shard per worker.
func initialPlan(p CoreParams) dataset.DataPlan {
	r := p.Run
	if r.Mode != config.Sync && r.DataSplit == config.SplitQueue {
		return dataset.NewQueuePlan(p.TrainN, r.Batch, r.Workers)
	}
	return dataset.NewDataPlan(p.TrainN, r.Batch, r.Workers)
}

// LeaseData hands worker the queue's next chunks while those it holds
// unread (past the position of its last heartbeat) would last less than
// leaseAhead at its measured rate, never fewer than two chunks and
// never more than an epoch (a fast worker on a small data set). Until
// its rate is measured, it is to hold what it was to hold last time,
// and twice that once it ran out: a fast worker is not kept waiting its
// first seconds, and a slow one does not pile up chunks it would still
// hold unread at the run's end. It returns the
// state to save before the worker is answered (ok: the plan changed). A
// worker that is not a member of the run (one removed, retired or
// quarantined) is handed nothing, nor is any before training began (or
// was adopted): a restarted chief's core before its adoption has a new
// state, which must not replace the saved one.
func (c *Core) LeaseData(worker int) (SaveState, bool) {
	p := c.st.Plan
	if !p.Queued() || c.phase != training || worker < 0 || worker >= c.workers() || c.retired[worker] || c.isQuarantined(worker) {
		return SaveState{}, false
	}
	r := c.reads[worker]
	want := int64(math.Ceil(r.rate * leaseAhead.Seconds()))
	if r.rate == 0 {
		want = r.want
		if r.waiting {
			want *= 2
		}
	}
	want = max(2*int64(p.Chunk), min(want, p.ChunksPerEpoch()*int64(p.Chunk)))
	r.want = want
	if c.reads != nil {
		c.reads[worker] = r
	}
	short := want - (p.Leased(worker) - r.pos)
	if short <= 0 {
		return SaveState{}, false
	}
	n := (short + int64(p.Chunk) - 1) / int64(p.Chunk)
	c.st.Plan = p.Lease(worker, int(n))
	st := c.save().(SaveState)
	if c.leasedSeq == nil {
		c.leasedSeq = map[int]int64{}
	}
	c.leasedSeq[worker] = st.State.Seq
	return st, true
}

// LeasedSeq is the number of the newest state that handed worker chunks
// (0: none). An answer that carries its chunks may go out only once that
// state (or a newer one) is written: another answer may carry chunks a
// heartbeat still saving handed out, and a write may fail.
func (c *Core) LeasedSeq(worker int) int64 { return c.leasedSeq[worker] }

// scaleQueue makes a change of the worker count of a run with a data
// queue at once: no hold is needed, since no worker owns a part of an
// epoch. An added worker is handed chunks from its registration on; a
// removed one is handed none, reads those it holds and is retired
// (retireLeaving).
func (c *Core) scaleQueue(now time.Time) []Action {
	p := c.st.Plan
	c.ach = &asyncChange{from: c.workers(), to: c.target, epoch: max(p.Last().Epoch, p.NextChunk/p.ChunksPerEpoch()),
		asked: c.targetAsked, began: now}
	c.log.Info("membership change: the data queue hands chunks to the new workers from now on", "from", c.workers(), "to", c.target)
	return c.publish(now)
}

// queueReport is the report's data_queue (nil without a queue).
func (c *Core) queueReport() *report.DataQueue {
	p := c.st.Plan
	if !p.Queued() {
		return nil
	}
	q := &report.DataQueue{ChunkBatches: p.Chunk, ChunksPerEpoch: p.ChunksPerEpoch(), ChunksHandedOut: p.NextChunk,
		BatchesRead: make([]int64, len(p.Leases))}
	for w := range q.BatchesRead {
		q.BatchesRead[w] = c.reads[w].pos
	}
	return q
}

// planFor is the plan worker is sent: a queue's with its own leases
// only.
func (c *Core) planFor(worker int) dataset.DataPlan {
	return c.Plan().ForWorker(worker)
}
