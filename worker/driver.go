package worker

import (
	"context"
	"runtime"

	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/transport/rowclient"
)

// run is one Run's driver state.
type run struct {
	w   *Worker
	ctx context.Context
	// pushCtx is the pushes' context: ctx, or the one ctx is derived
	// from when a stop cuts ctx (Worker.RunStoppable).
	pushCtx context.Context
	core    *Core
	// events carries the answers of the calls under way (calls of them),
	// sent by their goroutines; room for a pull and a push per shard, so
	// no sender waits.
	events chan event
	calls  int
	// cut cancels the pull round under way (nil: none).
	cut   context.CancelFunc
	grads [][]float32 // the last passes' gradients
	// ended says the data source was closed while the worker waited for
	// a batch (see dataEnded): Run ends.
	ended bool
}

// event is one call's answer: a pull's or a push's.
type event struct {
	pull *pulled
	push *PushOutcome
}

// pulled is a pull's answer and, when it came as a flat buffer (not
// read straight into the net), the buffer.
type pulled struct {
	ans  PullAnswer
	flat []float32
}

// perform carries out acts in order, with what those that compute give
// the core; done says Run ends, with err.
func (r *run) perform(acts []Action) (done bool, err error) {
	w := r.w
	for i := 0; i < len(acts) && !r.ended; i++ {
		switch a := acts[i].(type) {
		case HeadStart:
			n := r.headStart(a)
			acts = append(acts, r.core.HeadStarted(w.cfg.Clock.Now(), n)...)
		case Compute:
			loss, err := r.compute(a)
			acts = append(acts, r.core.Computed(w.cfg.Clock.Now(), loss, err)...)
		case Phase:
			if a.Name == metrics.PhasePull && w.cfg.AfterPull != nil {
				w.cfg.AfterPull(a.Step)
			}
			w.cfg.Metrics.ObservePhase(a.Name, a.Took)
		case Finish:
			return true, a.Err
		default:
			r.performPlain(a)
		}
	}
	return r.ended, nil
}

// performPlain carries out an action that gives the core nothing back.
func (r *run) performPlain(act Action) {
	w := r.w
	switch a := act.(type) {
	case PullRound:
		r.pullRound(a)
	case CancelPulls:
		r.cancelRound()
	case TakeBack:
		w.takeBack(a.Shard, a.CopyIn)
	case Forget:
		w.cfg.Net.Forget()
	case Seek:
		w.cfg.Batches.SeekBatch(a.Position)
	case Push:
		r.push(a)
	case StepDone:
		w.stepDone(a)
	}
}

// deliver hands the core one call's answer.
func (r *run) deliver(ev event) []Action {
	r.calls--
	now := r.w.cfg.Clock.Now()
	if ev.push != nil {
		return r.core.Pushed(now, *ev.push)
	}
	p := ev.pull
	if p.ans.Err == nil && !p.ans.Stalled {
		p.ans.Placed = r.w.readShard(p.ans.Shard, p.flat)
	}
	return r.core.Pulled(now, p.ans)
}

// pullRound starts a PullRound's pulls, each on a goroutine of its own,
// under a context CancelPulls ends.
func (r *run) pullRound(a PullRound) {
	r.cancelRound()
	ctx, cancel := context.WithCancel(r.ctx)
	r.cut = cancel
	r.calls += len(a.Pulls)
	for _, p := range a.Pulls {
		go func() { r.events <- event{pull: r.w.pullOne(ctx, p)} }()
	}
}

// cancelRound cancels the pulls of the round under way, if any.
func (r *run) cancelRound() {
	if r.cut != nil {
		r.cut()
		r.cut = nil
	}
}

// headStart carries out a HeadStart and says how many blocks it
// computed.
func (r *run) headStart(a HeadStart) int {
	c := r.w.cfg
	if a.Load {
		r.next()
	}
	n := 0
	for _, row := range a.Rows {
		if !c.Net.ForwardRows(row) {
			break
		}
		n++
	}
	return n
}

// next loads the next batch into the net's input, unless the data
// source was closed while the worker waited for it
// (dataset.ElasticBatches.Close: removed after its last batch, or told
// to stop at a hold): then Run ends (ended) without pushing what is
// computed on no batch.
func (r *run) next() {
	c := r.w.cfg
	c.Batches.Next(c.Net.Input(), r.w.labels)
	if e, ok := c.Batches.(interface{ Ended() bool }); ok && e.Ended() && !r.ended {
		r.ended = true
		c.Log.Info("no more data for this worker: it ends", "worker", c.Index)
	}
}

// compute carries out a Compute: the passes, keeping their gradients
// for the pushes.
func (r *run) compute(a Compute) (float32, error) {
	c := r.w.cfg
	if a.Load {
		r.next()
	}
	c.Net.SetLabels(r.w.labels)
	// A net that pushes part of its step itself (a CTR net's rows, pushed
	// before the dense gradient unless they go with it: RowsRider)
	// pushes on the pushes' context: a stop between those pushes and the
	// step's would leave some rows applied and the batch to be trained
	// again after it.
	loss, err := step(r.ctx, r.pushCtx, c.Net, a.Views)
	if err != nil {
		return 0, err
	}
	r.grads, err = c.Net.Grads()
	return loss, err
}

// rowsFinal is the net's announcement, during a Compute, that the first
// layer's gradient is final from row up (nn.Net.SetEarlyRows): the core
// says which shards to push now.
func (w *Worker) rowsFinal(row int, loss float32) {
	r := w.run
	if r == nil {
		return
	}
	for _, a := range r.core.RowsFinal(row, loss) {
		r.push(a.(Push))
	}
}

// push starts a Push's pushes, each on a goroutine of its own. A step's
// gradient goes through BeforePush and its fault first. Early pushes
// are yielded to (Gosched) so that they are written at once: with
// GOMAXPROCS=1 the goroutines would otherwise start when the runtime's
// monitor takes the processor from the net's next cgo product, up to a
// millisecond later with the timer slack.
func (r *run) push(a Push) {
	w := r.w
	grads := r.grads
	var rows *rowclient.Staged // the step's rows, to go with its pushes
	if rr, ok := w.cfg.Net.(RowsRider); ok && a.Kind != EarlyPush {
		rows = rr.StagedRows() // (a catch-up's too: its rows are of the version it caught up)
	}
	switch a.Kind {
	case StepPush:
		if w.cfg.BeforePush != nil {
			w.cfg.BeforePush(a.Step)
		}
		scale(grads, a.Scale)
	case EarlyPush:
		w.early.Add(int64(len(a.Shards)))
		var err error
		if grads, err = w.cfg.Net.Grads(); err != nil {
			grads = nil // (not for a net that announces: it has gradients)
		}
	}
	r.calls += len(a.Shards)
	for _, s := range a.Shards {
		go func() {
			out := PushOutcome{Shard: s, Err: errNoGradients}
			if grads != nil {
				out = w.pushOne(r.pushCtx, s, a, grads, rows)
			}
			r.events <- event{push: &out}
		}()
	}
	if a.Kind == EarlyPush {
		runtime.Gosched()
	}
}

// scale multiplies grads by k (a gradient fault) unless k is 1.
func scale(grads [][]float32, k float32) {
	if k == 1 {
		return
	}
	for _, g := range grads {
		for i := range g {
			g[i] *= k
		}
	}
}

// stepDone records a finished step.
func (w *Worker) stepDone(a StepDone) {
	m := w.cfg.Metrics
	w.mu.Lock()
	w.step, w.lastLoss = a.Steps, a.Loss
	w.mu.Unlock()
	if a.HeadStarted {
		w.ahead.Add(1)
	}
	m.Steps.Inc()
	w.wire.stepDone()
	m.Samples.Add(float64(w.cfg.Net.Batch()))
	m.TrainLoss.Set(float64(a.Loss))
}
