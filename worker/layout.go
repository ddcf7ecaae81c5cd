package worker

import (
	"time"

	"github.com/pstrain/pstrain/ml/partition"

	pb "github.com/pstrain/pstrain/proto"
)

// LayoutFollower is how a worker follows a change of the run's PS count
// or a rebalance (docs/elastic.md, "Parameter servers",
// "Rebalancing"): its heartbeats say the layout it uses (Layout: the
// shard count and weights) and hand it the layout the chief asks for
// when that differs (Switch), which ends the worker's Run for its owner
// to rebuild it on the new layout.
type LayoutFollower interface {
	Layout() partition.Layout
	Switch(to partition.Layout)
}

// stallBeat is how often a worker whose steps have stopped sends
// heartbeats while it follows a layout: a change of the PS count holds
// every worker's pull at a step boundary, and the chief's answer to a
// heartbeat is how the worker learns the new count. Quicker than the
// usual quarter of the heartbeat timeout, so that the pause stays short.
const stallBeat = 20 * time.Millisecond

// stallWatch says when a stalled worker's extra heartbeat is due.
type stallWatch struct {
	steps    int64
	moved    time.Time // when steps last changed
	lastBeat time.Time
}

// due says whether an extra heartbeat is due at now, with steps the
// worker's steps done.
func (s *stallWatch) due(now time.Time, steps int64) bool {
	if steps != s.steps || s.moved.IsZero() {
		s.steps, s.moved = steps, now
		return false
	}
	return now.Sub(s.moved) >= 2*stallBeat && now.Sub(s.lastBeat) >= stallBeat
}

// beaten notes a heartbeat sent at now.
func (s *stallWatch) beaten(now time.Time) { s.lastBeat = now }

// followLayout fills in the request's layout and hands the follower
// the answer's, when it differs.
func (w *Worker) followLayout(req *pb.HeartbeatRequest, resp *pb.HeartbeatResponse) {
	l := w.cfg.Layout
	if l == nil {
		return
	}
	cur := l.Layout()
	if resp == nil {
		req.NumPs, req.PsWeights = int32(cur.PS), cur.Weights32()
		return
	}
	if n := int(resp.NumPs); n > 0 {
		to := partition.LayoutOf(n, resp.PsWeights)
		if !to.Equal(cur) {
			w.cfg.Log.Info("parameter servers changed: switching layouts", "worker", w.cfg.Index, "from", cur.String(), "to", to.String())
			l.Switch(to)
		}
	}
}
