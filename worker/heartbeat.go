package worker

import (
	"context"
	"errors"
	"time"

	"github.com/pstrain/pstrain/ml/dataset"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
)

// PlanFollower is a worker's data source under an elastic run's data
// plan (dataset.ElasticBatches): heartbeats say how many eras it knows
// and hand it the chief's plan when that differs; SetPlan loads the new
// data shard before it returns, so the next heartbeat's acknowledgement
// means the worker can read the new era (docs/elastic.md).
type PlanFollower interface {
	Eras() int
	SetPlan(dataset.DataPlan) error
}

// DataReader is a PlanFollower that says where it reads
// (dataset.ElasticBatches): heartbeats carry it, so that the chief can
// place an async or ssp run's change and hand out the data queue's
// chunks (docs/elastic.md); Leases is the queue's chunks its plan hands
// it. Close ends a read that waits for a plan (a removed worker that
// read all its batches, or the run's end).
type DataReader interface {
	Position() int64
	Hold() int64
	Waiting() bool
	Leases() int
	Close()
}

// Heartbeats keeps the worker live at the chief until ctx ends: a
// heartbeat every quarter of timeout (at least every 50 ms), carrying the
// steps done, each given timeout to answer. A failed heartbeat is logged
// at debug level; the chief declares the worker dead only after timeout
// without one. When ctx ends it sends one more, within a second, so
// that the chief's report counts the worker's last steps and bytes.
//
// A worker that follows a layout (Config.Layout) also beats once at the
// start (it may have just switched layouts: the chief waits for it to
// say so) and every stallBeat while its steps have stopped.
func (w *Worker) Heartbeats(ctx context.Context, chief pb.ChiefClient, timeout time.Duration) {
	t := time.NewTicker(max(timeout/4, 50*time.Millisecond))
	defer t.Stop()
	var nudges <-chan struct{} // a beat at once when the reading changed
	if n, ok := w.cfg.DataPlan.(interface{ Nudges() <-chan struct{} }); ok {
		nudges = n.Nudges()
	}
	var fast <-chan time.Time
	var stall stallWatch
	if w.cfg.Layout != nil {
		f := time.NewTicker(stallBeat)
		defer f.Stop()
		fast = f.C
		stall.beaten(time.Now())
		if !w.beat(ctx, chief, timeout) {
			return
		}
	}
	for {
		select {
		case <-ctx.Done():
			last, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(timeout, time.Second))
			defer cancel()
			w.beat(last, chief, timeout)
			return
		case <-t.C:
		case <-nudges:
		case now := <-fast:
			if steps, _ := w.Progress(); !stall.due(now, steps) {
				continue
			}
		}
		stall.beaten(time.Now())
		if !w.beat(ctx, chief, timeout) {
			return
		}
	}
}

// beat sends one heartbeat and follows its answer; false: the worker
// is quarantined, and sends no more.
func (w *Worker) beat(ctx context.Context, chief pb.ChiefClient, timeout time.Duration) bool {
	step, _ := w.Progress()
	req := &pb.HeartbeatRequest{Worker: int32(w.cfg.Index), RunId: w.cfg.RunID, Step: step}
	req.StepsDone, req.PushBytes, req.PullBytes = w.WireCounts()
	if w.cfg.DataPlan != nil {
		req.PlanEras = int32(w.cfg.DataPlan.Eras())
	}
	dr, reads := w.cfg.DataPlan.(DataReader)
	if reads {
		req.DataPosition, req.PlanHold, req.DataWaiting = dr.Position(), dr.Hold(), dr.Waiting()
		req.PlanLeases = int32(dr.Leases())
	}
	w.followLayout(req, nil)
	hctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := chief.Heartbeat(hctx, req)
	cancel()
	if err != nil && ctx.Err() == nil {
		w.cfg.Log.Debug("heartbeat failed", "worker", w.cfg.Index, "err", err)
	}
	if err == nil && resp.DataPlan != nil && w.cfg.DataPlan != nil {
		w.followPlan(resp.DataPlan)
	}
	if err == nil {
		w.followLayout(req, resp)
	}
	if err == nil && resp.Stop && reads && dr.Waiting() {
		// Told to stop while waiting for data: removed after its last
		// batch, or the run ended with it at a hold.
		w.cfg.Log.Info("told to stop while waiting for data: ending", "worker", w.cfg.Index, "position", dr.Position())
		dr.Close()
	}
	if err == nil && resp.Quarantined != "" {
		w.quarantined(resp.Quarantined)
		return false
	}
	return true
}

// quarantined reports that the chief quarantined this worker
// (docs/security.md, "Attribution"): the shards refuse its gradients and
// its pulls answer done, so its training loop ends by itself; its
// heartbeats stop here.
func (w *Worker) quarantined(why string) {
	w.cfg.Log.Error("this worker is quarantined by the chief: its gradients are refused and it stops training",
		"worker", w.cfg.Index, "why", why)
}

// followPlan hands the data source the chief's new plan.
func (w *Worker) followPlan(m *pb.DataPlan) {
	p, err := convert.Plan(m)
	if err == nil {
		err = w.cfg.DataPlan.SetPlan(p)
	}
	if errors.Is(err, dataset.ErrPastHold) {
		// The chief places the change later (it reads our position).
		w.cfg.Log.Info("data plan's hold refused: this worker has read past it", "worker", w.cfg.Index, "err", err)
		return
	}
	if err != nil {
		w.cfg.Log.Error("cannot follow the chief's data plan", "worker", w.cfg.Index, "err", err)
		return
	}
	last := p.Last()
	w.cfg.Log.Info("data plan changed", "worker", w.cfg.Index, "eras", len(p.Eras), "workers", last.Workers, "from_epoch", last.Epoch, "from_step", last.Step, "hold", p.Hold)
}
