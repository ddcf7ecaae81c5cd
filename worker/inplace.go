package worker

import "github.com/pstrain/pstrain/ps"

// Parameters read in place, where the pulls leave them (docs/scaling.md,
// "The levers in the code"). A same-host PS answers a pull in the region it
// shares with the connection (dataplane, shm.go); copying the answer
// into the net's weights was a pass over the whole model on the worker
// every step. Instead the net reads each piece of the parameters from
// the region (nn.Net.ReadFrom) until the shard's next pull. That is
// safe because a region changes only when the PS answers a request on
// its connection, and a shard's pulls have a connection of their own
// (Shard.Puller):
//
//   - everything that reads the parameters (the step's passes, the next
//     step's forward pass started ahead, a catch-up's passes) runs
//     between a shard's answer and its next pull;
//   - a pull round after the first (ps.Align asked for more) may fail or
//     be cut short, and the worker may then push a catch-up gradient
//     computed on what it has: so before such a round the shards it
//     pulls are copied into the net's weights (keepPlaced);
//   - when Run returns, the net reads its weights again, with what the
//     shards last answered copied into them (unplace): a failed or
//     cancelled pull may have unmapped its region.
//
// Any other pull (another data plane, TLS, no region) is copied as
// before, and a shard's answer in its region replaces what the net read
// for it.

// setupInPlace turns in-place reads on for the shards whose pulls have a
// client of their own that can leave them in place, and whose every
// block is a piece the net can read from elsewhere. (It asks the net by
// pointing each piece at the net's own memory and back, which leaves
// every piece read from the weights.)
func (w *Worker) setupInPlace() {
	c := w.cfg
	if !w.pullersApart() {
		return
	}
	params := c.Net.Params()
	for s := range c.Shards {
		_, ok := c.Shards[s].puller().(ViewingDataPlane)
		for _, b := range c.Plan.Shards[s].Blocks {
			cols := c.Plan.Vars[b.Var].Cols
			ok = ok && c.Net.ReadFrom(b.Var, b.RowStart, params[b.Var][b.RowStart*cols:b.RowEnd*cols])
			c.Net.ReadFrom(b.Var, b.RowStart, nil)
		}
		if ok && w.inPlace == nil {
			w.inPlace = make([]bool, len(c.Shards))
			w.placed = make([][]float32, len(c.Shards))
			w.placedStale = make([]bool, len(c.Shards))
		}
		if ok {
			w.inPlace[s] = true
		}
	}
}

// pullStarts notes that a pull of shard s is about to be sent: until it
// is answered, what the net reads of s in place may be unmapped by a
// failure (unplace then does not copy it).
func (w *Worker) pullStarts(s int) {
	if w.inPlace != nil {
		w.placedStale[s] = true
	}
}

// readShard has the net read shard s's parameters from flat, the
// shard's flat buffer as a pull answered it, or, if flat is nil, from
// its weights, where the pull wrote them. A shard not read in place has
// flat scattered into the weights.
func (w *Worker) readShard(s int, flat []float32) {
	c := w.cfg
	if w.inPlace == nil || !w.inPlace[s] {
		if flat != nil {
			c.Plan.Scatter(s, flat, c.Net.Params())
		}
		return
	}
	w.point(s, flat)
	w.placed[s], w.placedStale[s] = flat, false
}

// point has the net read shard s's pieces from flat (nil: its weights).
func (w *Worker) point(s int, flat []float32) {
	c := w.cfg
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

// keepPlaced copies into the net's weights what it reads in place of
// the shards pulls are about to pull again (a round after the first: see
// above), so a pull that fails or is cut short cannot change them.
func (w *Worker) keepPlaced(pulls []ps.Pull) {
	if w.inPlace == nil {
		return
	}
	for _, p := range pulls {
		w.takeBack(p.Shard, w.placed[p.Shard] != nil)
	}
}

// unplace has the net read its weights again, with the shards' last
// answers copied into them where they are still mapped (Run's end: the
// net may be used after it, by a test or the next worker built on it).
func (w *Worker) unplace() {
	if w.inPlace == nil {
		return
	}
	for s, flat := range w.placed {
		w.takeBack(s, flat != nil && !w.placedStale[s])
	}
}

// takeBack has the net read shard s from its weights again, after
// copying what it read in place into them if copyIn.
func (w *Worker) takeBack(s int, copyIn bool) {
	if copyIn {
		w.cfg.Plan.Scatter(s, w.placed[s], w.cfg.Net.Params())
	}
	w.point(s, nil)
	w.placed[s] = nil
}
