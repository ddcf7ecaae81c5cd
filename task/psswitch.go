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
// "Parameter servers"): the chief's heartbeat answer names the new
// count once every shard is held (sync: at the change's step boundary);
// the worker's training loop is stopped (nothing of it is lost: its
// pulls were held, the pushes under way are answered first, and the
// shards keep its data position), the worker is rebuilt on the layout
// of that many shards (the same net and data, connections to the PS
// slots it lacked), and its next heartbeat says so. Its pulls then wait
// at the shards until the chief has initialised the new layout.

// layoutSwitch is the worker.LayoutFollower of a worker task: the PS
// count its layout has, and the one the chief asked for (0: none) with
// the cancel of the training loop under way.
type layoutSwitch struct {
	mu     sync.Mutex
	ps     int
	want   int
	cancel context.CancelFunc
}

// PS is the PS count of the worker's layout.
func (l *layoutSwitch) PS() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ps
}

// SwitchPS records the count the chief asks for and stops the training
// loop.
func (l *layoutSwitch) SwitchPS(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n == l.ps || n == l.want {
		return
	}
	l.want = n
	if l.cancel != nil {
		l.cancel()
	}
}

// arm makes cancel the stop of the training loop under way; a count
// asked for before is acted on at once.
func (l *layoutSwitch) arm(cancel context.CancelFunc) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel = cancel
	if l.want != 0 {
		cancel()
	}
}

// take returns the count asked for (0: none), which stays asked for
// until switched: a heartbeat answered meanwhile (the stopped loop's
// last) asks for it again, which then changes nothing.
func (l *layoutSwitch) take() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel = nil
	return l.want
}

// switched records that the layout has n shards now.
func (l *layoutSwitch) switched(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ps = n
	if l.want == n {
		l.want = 0
	}
}

// switchPS rebuilds the worker on the layout of n shards.
func (w *Worker) switchPS(n int) error {
	if n > len(w.o.Cluster.PS) {
		return fmt.Errorf("worker: the chief asks for %d parameter servers; the cluster lists %d", n, len(w.o.Cluster.PS))
	}
	plan, err := partition.New(w.spec, n)
	if err != nil {
		return err
	}
	shards, err := w.shardsFor(n)
	if err != nil {
		return err
	}
	cfg := w.cfg
	cfg.Plan, cfg.Shards = plan, shards
	nw, err := worker.New(cfg)
	if err != nil {
		return err
	}
	w.w, w.cfg = nw, cfg
	w.layout.switched(n)
	w.o.Log.Info("switched to the layout of the new PS count", "worker", w.o.Task.Index, "ps", n)
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
func initialPS(o Options, reg *pb.RegisterResponse) int {
	switch {
	case reg != nil && reg.NumPs > 0 && int(reg.NumPs) <= len(o.Cluster.PS):
		return int(reg.NumPs)
	case o.Run.PS > 0 && o.Run.PS < len(o.Cluster.PS) && len(o.Cluster.PS) == o.Run.PSSlots():
		return o.Run.PS
	}
	return len(o.Cluster.PS)
}
