package worker

import "github.com/pstrain/pstrain/ps"

// Parameters read where the pulls leave them (docs/scaling.md,
// "Performance VI"). A same-host PS answers a pull in the region it
// shares with the connection (dataplane, shm.go); copying the answer
// into the net's weights was a pass over the whole model on the worker
// every step. Instead the net reads each piece of the parameters from
// the region (nn.Net.ReadFrom) until the shard's next pull. That is
// safe because a region changes only when the PS answers a request on
// its connection, and a shard's pulls have a connection of their own
// (Shard.Puller):
//
//   - a step's pulls start after its forward and backward passes, which
//     are the only readers (pushes read the gradients);
//   - a pull round after the first (ps.Align asked for more) may fail or
//     be cut short, and the worker may then push a catch-up gradient
//     computed on what it has: so before such a round the pieces are
//     copied into the net's weights (ownViews).
//
// Any other pull (another data plane, TLS, no region) is copied as
// before, and a shard's answer in its region replaces what the net read
// for it.

// setupViews turns views on for the shards whose pulls have a client of
// their own that can leave them in place, and whose every block is a
// piece the net can read from elsewhere.
func (w *Worker) setupViews() {
	c := w.cfg
	if !w.pullersApart() {
		return
	}
	params := c.Net.Params()
	for s := range c.Shards {
		_, ok := c.Shards[s].puller().(ViewingDataPlane)
		for _, b := range c.Plan.Shards[s].Blocks {
			cols := c.Plan.Vars[b.Var].Cols
			// Read from its own memory (nothing changes), to ask.
			ok = ok && c.Net.ReadFrom(b.Var, b.RowStart, params[b.Var][b.RowStart*cols:b.RowEnd*cols])
			c.Net.ReadFrom(b.Var, b.RowStart, nil)
		}
		if ok && w.viewed == nil {
			w.viewed = make([]bool, len(c.Shards))
		}
		if ok {
			w.viewed[s] = true
		}
	}
}

// readShard has the net read shard s's parameters from flat, the
// shard's flat buffer as a pull answered it, or, if flat is nil, from
// its weights, where the pull wrote them. A shard without views has
// flat scattered into the weights.
func (w *Worker) readShard(s int, flat []float32) {
	c := w.cfg
	if w.viewed == nil || !w.viewed[s] {
		if flat != nil {
			c.Plan.Scatter(s, flat, c.Net.Params())
		}
		return
	}
	off := 0
	for _, b := range c.Plan.Shards[s].Blocks {
		n := (b.RowEnd - b.RowStart) * c.Plan.Vars[b.Var].Cols
		var piece []float32
		if flat != nil {
			piece = flat[off : off+n]
		}
		c.Net.ReadFrom(b.Var, b.RowStart, piece)
		off += n
	}
}

// ownViews copies into the net's weights what it reads from the regions
// of the shards pulls are about to pull again (a round after the first:
// see above), so a pull that fails or is cut short cannot change them.
func (w *Worker) ownViews(pulls []ps.Pull) {
	for _, p := range pulls {
		if w.viewed != nil && w.viewed[p.Shard] {
			w.cfg.Net.Own()
			return
		}
	}
}
