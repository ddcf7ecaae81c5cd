package worker

// Parameters read in place, where the pulls leave them (docs/scaling.md,
// "The levers in the code"). A same-host PS answers a pull in the region
// it shares with the connection (dataplane, shm.go); copying the answer
// into the net's weights would be a pass over the whole model on the
// worker every step. Instead the net reads each piece of the parameters
// from the region (nn.Net.ReadFrom) until the shard's next pull. That is
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
//     pulls are copied into the net's weights (inPlaceReads.keep);
//   - when Run returns, the net reads its weights again, with what the
//     shards last answered copied into them (inPlaceReads.release): a
//     failed or cancelled pull may have unmapped its region.
//
// Any other pull (another data plane, TLS, no region) is copied, and a
// shard's answer in its region replaces what the net read for it.

// inPlaceReads is the core's state of the in-place reads: by shard,
// whether the net reads its parameters in place now, and whether a pull
// sent since may have unmapped them.
type inPlaceReads struct {
	on     []bool // nil: no shard is read in place
	placed []bool
	stale  []bool
}

func newInPlaceReads(p CoreParams) inPlaceReads {
	if p.InPlace == nil {
		return inPlaceReads{}
	}
	return inPlaceReads{on: p.InPlace, placed: make([]bool, p.Shards), stale: make([]bool, p.Shards)}
}

// pullSent notes that a pull of shard s is sent: until it is answered,
// what the net reads of s in place may be unmapped by a failure.
func (r *inPlaceReads) pullSent(s int) {
	if r.on != nil {
		r.stale[s] = true
	}
}

// answered notes a pull's answer: the net reads s in place (placed) or
// from its weights.
func (r *inPlaceReads) answered(s int, placed bool) {
	if r.on != nil {
		r.placed[s], r.stale[s] = placed, false
	}
}

// keep copies into the net's weights what it reads of s in place,
// before s is pulled again in a round after the first.
func (r *inPlaceReads) keep(s int) []Action {
	if r.on == nil || !r.placed[s] {
		return nil
	}
	r.placed[s] = false
	return []Action{TakeBack{Shard: s, CopyIn: true}}
}

// release has the net read every shard from its weights again, copying
// in what is still mapped (Run's end: the net may be used after it, by a
// test or the next worker built on it).
func (r *inPlaceReads) release() []Action {
	var acts []Action
	for s := range r.placed {
		if r.placed[s] {
			r.placed[s] = false
			acts = append(acts, TakeBack{Shard: s, CopyIn: !r.stale[s]})
		}
	}
	return acts
}

// inPlacePlan says, by shard, whether the net can read its parameters in
// place: its pulls have a client of their own that can leave them in
// place, and every block is a piece the net can read from elsewhere. (It
// asks the net by pointing each piece at the net's own memory and back,
// which leaves every piece read from the weights.) nil: no shard.
func (w *Worker) inPlacePlan() []bool {
	c := w.cfg
	if !w.pullersApart() || w.comp.pulls() {
		// (Compressed pulls are applied to the worker's copy of the
		// parameters, which the net reads once scattered.)
		return nil
	}
	var on []bool
	params := c.Net.Params()
	for s := range c.Shards {
		_, ok := c.Shards[s].puller().(ViewingDataPlane)
		for _, b := range c.Plan.Shards[s].Blocks {
			cols := c.Plan.Vars[b.Var].Cols
			ok = ok && c.Net.ReadFrom(b.Var, b.RowStart, params[b.Var][b.RowStart*cols:b.RowEnd*cols])
			c.Net.ReadFrom(b.Var, b.RowStart, nil)
		}
		if ok && on == nil {
			on = make([]bool, len(c.Shards))
		}
		if ok {
			on[s] = true
		}
	}
	return on
}

// readShard has the net read shard s's parameters from flat, the
// shard's flat buffer as a pull answered it, or, if flat is nil, from
// its weights, where the pull wrote them, and says whether it now reads
// them in place. A shard not read in place has flat scattered into the
// weights.
func (w *Worker) readShard(s int, flat []float32) (placed bool) {
	c := w.cfg
	if w.inPlace == nil || !w.inPlace[s] {
		if flat != nil {
			c.Plan.Scatter(s, flat, c.Net.Params())
		}
		return false
	}
	w.point(s, flat)
	w.regions[s] = flat
	return flat != nil
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

// takeBack carries out a TakeBack: the net reads shard s from its
// weights again, after copying what it read in place into them if
// copyIn.
func (w *Worker) takeBack(s int, copyIn bool) {
	if copyIn && w.regions[s] != nil {
		w.cfg.Plan.Scatter(s, w.regions[s], w.cfg.Net.Params())
	}
	w.point(s, nil)
	w.regions[s] = nil
}
