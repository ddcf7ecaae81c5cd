package task

import (
	"context"
	"fmt"
	"sync"

	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/worker"
)

// A worker's half of a change of the PS count (docs/elastic.md,
// "Parameter servers"), or of a rebalance (the same count, other
// weights; "Rebalancing"): the chief's heartbeat answer names the new
// layout once every shard is held (sync: at the change's step boundary);
// the worker's training loop is stopped (nothing of it is lost: its
// pulls were held, the pushes under way are answered first, and the
// shards keep its data position), the worker is rebuilt on the layout
// of that many shards (the same net and data, connections to the PS
// slots it lacked; a CTR worker's rows go to the new count's shards,
// embed.ShardOf), and its next heartbeat says so. Its pulls then wait
// at the shards until the chief has initialised the new layout.

// layoutSwitch is the worker.LayoutFollower of a worker task: the
// layout (PS count and weights) the worker uses, and the one the chief
// asked for (PS 0: none) with the cancel of the training loop under way.
type layoutSwitch struct {
	mu     sync.Mutex
	cur    partition.Layout
	want   partition.Layout
	cancel context.CancelFunc
}

// Layout is the worker's layout.
func (l *layoutSwitch) Layout() partition.Layout {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur
}

// Switch records the layout the chief asks for and stops the training
// loop.
func (l *layoutSwitch) Switch(to partition.Layout) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if to.Equal(l.cur) || to.Equal(l.want) {
		return
	}
	l.want = to
	if l.cancel != nil {
		l.cancel()
	}
}

// arm makes cancel the stop of the training loop under way; a layout
// asked for before is acted on at once.
func (l *layoutSwitch) arm(cancel context.CancelFunc) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel = cancel
	if l.want.PS != 0 {
		cancel()
	}
}

// take returns the layout asked for (PS 0: none), which stays asked for
// until switched: a heartbeat answered meanwhile (the stopped loop's
// last) asks for it again, which then changes nothing.
func (l *layoutSwitch) take() partition.Layout {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel = nil
	return l.want
}

// switched records that the worker uses to now.
func (l *layoutSwitch) switched(to partition.Layout) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cur = to
	if l.want.Equal(to) {
		l.want = partition.Layout{}
	}
}

// switchLayout rebuilds the worker on the layout to.
func (w *Worker) switchLayout(to partition.Layout) error {
	if to.PS > len(w.o.Cluster.PS) {
		return fmt.Errorf("worker: the chief asks for %d parameter servers; the cluster lists %d", to.PS, len(w.o.Cluster.PS))
	}
	plan, err := to.Plan(w.spec)
	if err != nil {
		return err
	}
	shards, err := w.shardsFor(to.PS)
	if err != nil {
		return err
	}
	if w.ctr != nil {
		rows, err := w.rowsFor(w.cfg.RunID, to.PS)
		if err != nil {
			return err
		}
		if err := w.ctr.UseRows(rows); err != nil {
			return err
		}
	}
	cfg := w.cfg
	cfg.Plan, cfg.Shards = plan, shards
	nw, err := worker.New(cfg)
	if err != nil {
		return err
	}
	w.w, w.cfg = nw, cfg
	w.layout.switched(to)
	w.o.Log.Info("switched to the new layout of the parameter servers", "worker", w.o.Task.Index, "ps", to.String())
	return nil
}

// shardsFor is the connections to the first n PS slots, dialling those
// not dialled yet. A removed slot's connection stays open until Close
// (its process exits; a later change may add the slot back).
func (w *Worker) shardsFor(n int) ([]worker.Shard, error) {
	if have := len(w.conns); n > have {
		more, err := w.dialSlots(have, n)
		if err != nil {
			return nil, err
		}
		w.conns = append(w.conns, more...)
	}
	return w.conns[:n:n], nil
}

// initialPS is the PS count a worker's layout starts with: the chief's
// (its registration's answer), else the run's --ps when the cluster
// lists more PS slots (--max-ps), else every PS the cluster lists.
// (initialLayout adds the chief's weights.)
func initialPS(o Options, reg *pb.RegisterResponse) int {
	switch {
	case reg != nil && reg.NumPs > 0 && int(reg.NumPs) <= len(o.Cluster.PS):
		return int(reg.NumPs)
	case o.Run.PS > 0 && o.Run.PS < len(o.Cluster.PS) && len(o.Cluster.PS) == o.Run.PSSlots():
		return o.Run.PS
	}
	return len(o.Cluster.PS)
}

// initialLayout is the layout a worker starts with: initialPS's count
// with the weights the chief's registration answer gives (after a
// rebalance; none: equal shares).
func initialLayout(o Options, reg *pb.RegisterResponse) partition.Layout {
	n := initialPS(o, reg)
	if reg == nil || int(reg.NumPs) != n {
		return partition.Even(n)
	}
	return partition.LayoutOf(n, reg.PsWeights)
}
