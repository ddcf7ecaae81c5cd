package worker

import (
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
	"sync/atomic"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/ps"
)

// Early pushes (wait-free backpropagation at the shard boundaries,
// docs/scaling.md "The levers in the code"). The backward pass ends with the
// first layer's weight gradient, the step's largest product, and the
// shards hold that variable in blocks of rows (partition.Plan). A sync
// worker has the net compute it in row blocks, last first
// (nn.Net.SetEarlyRows), and pushes each shard as soon as every row and
// variable it holds is final, while the net computes the rows below.
// The shard that holds row 0 goes with the step's other pushes. The
// gradient and the semantics of a step are the same; a shard's work on
// the push runs while the worker still computes, on a core the sync
// barrier would otherwise leave idle.

// earlyPlan is when each shard of p can be pushed: rows are the first
// layer's row blocks' starts (ascending, all > 0) and ready[i] the shards
// whose rows and variables are all final once rows[i] and up are: those
// holding nothing of the first variable below rows[i], and not already
// ready at a higher row. Shards holding row 0 are in no list. Empty when
// only the shards holding row 0 hold the first variable: then nothing
// goes early, though the shards of the layers above are final before
// the first layer's product starts (the net announces only row blocks).
func earlyPlan(p partition.Plan) (rows []int, ready [][]int) {
	first := make([]int, len(p.Shards)) // the shard's lowest row of variable 0; MaxInt: none
	for s, sh := range p.Shards {
		first[s] = math.MaxInt
		for _, b := range sh.Blocks {
			if b.Var == 0 {
				first[s] = min(first[s], b.RowStart)
			}
		}
		if first[s] > 0 && first[s] < math.MaxInt {
			rows = append(rows, first[s])
		}
	}
	slices.Sort(rows)
	rows = slices.Compact(rows)
	if len(rows) == 0 {
		return nil, nil
	}
	ready = make([][]int, len(rows))
	for s := range p.Shards {
		if first[s] == 0 {
			continue
		}
		// The largest row block start at or below the shard's first row:
		// the first announcement (they come highest first) after which
		// all of it is final. A shard without the first variable is
		// final at the first announcement.
		i := len(rows) - 1
		for i > 0 && rows[i] > first[s] {
			i--
		}
		ready[i] = append(ready[i], s)
	}
	return rows, ready
}

// early is a worker's state for its early pushes.
type early struct {
	rows  []int
	ready [][]int
	// Set by arm for one compute, cleared by disarm.
	armed  bool
	ctx    context.Context
	views  []ps.PullView // the step's views, the pushes' tags
	sent   []bool        // by shard: pushed early this step
	flying int           // early pushes not yet collected
	done   chan error    // their results
	count  atomic.Int64  // shards pushed early, all steps
}

// EarlyPushes is how many shard pushes the worker has started early,
// before its step's backward pass ended, answered or not (0 if it sends
// none early).
func (w *Worker) EarlyPushes() int64 {
	if w.early == nil {
		return 0
	}
	return w.early.count.Load()
}

// setupEarly turns early pushes on for a sync worker whose net supports
// them (the MLP's written-out pass) and whose plan has shards to send
// early. A worker that poisons its gradients (Config.Faults) sends them
// all after the step, where the poison is applied, as does one with a
// BeforePush hook, which is promised every push.
func (w *Worker) setupEarly() {
	c := w.cfg
	rows, ready := earlyPlan(c.Plan)
	if c.Run.Mode != config.Sync || len(rows) == 0 || len(w.faults.list) > 0 || c.BeforePush != nil {
		return
	}
	e := &early{rows: rows, ready: ready, views: make([]ps.PullView, len(c.Shards)), sent: make([]bool, len(c.Shards)),
		done: make(chan error, len(c.Shards))}
	if !c.Net.SetEarlyRows(rows, w.pushEarly) {
		return
	}
	w.early = e
}

// arm lets the next compute push shards early, tagged with views.
func (w *Worker) arm(ctx context.Context, views []ps.PullView) {
	if e := w.early; e != nil {
		e.armed, e.ctx = true, ctx
		copy(e.views, views)
	}
}

// disarm ends what arm allowed: announcements after it (those of a
// catch-up gradient's compute, say) push nothing.
func (w *Worker) disarm() {
	if e := w.early; e != nil {
		e.armed, e.ctx = false, nil
	}
}

// pushEarly is the net's announcement that the shards ready at row may
// go: they are pushed on a goroutine of their own, which writes the
// pushes and waits for the answers while the net goes on. The worker
// yields to it (Gosched) so that the pushes are written at once: with
// GOMAXPROCS=1 the goroutine would otherwise start when the runtime's
// monitor takes the processor from the net's next cgo product, up to a
// millisecond later with the timer slack (a build without the yield
// measured no worse, docs/scaling.md; the yield makes the start certain).
func (w *Worker) pushEarly(row int, loss float32) {
	e := w.early
	if e == nil || !e.armed {
		return
	}
	i, ok := slices.BinarySearch(e.rows, row)
	if !ok || len(e.ready[i]) == 0 {
		return
	}
	grads, err := w.cfg.Net.Grads()
	if err != nil {
		return // (not for a net that announces: it has gradients)
	}
	shards := e.ready[i]
	for _, s := range shards {
		e.sent[s] = true
	}
	e.count.Add(int64(len(shards)))
	e.flying++
	ctx, views := e.ctx, e.views
	go func() { e.done <- w.pushShards(ctx, shards, views, loss, grads) }()
	runtime.Gosched()
}

// collectEarly is shards less those pushed early this step, and a
// function that waits for those pushes and returns their errors. It
// resets the step's early state.
func (w *Worker) collectEarly(shards []int) (rest []int, wait func() error) {
	e := w.early
	if e == nil || e.flying == 0 {
		return shards, func() error { return nil }
	}
	rest = slices.DeleteFunc(slices.Clone(shards), func(s int) bool { return e.sent[s] })
	n := e.flying
	e.flying = 0
	clear(e.sent)
	return rest, func() error {
		var errs []error
		for range n {
			errs = append(errs, <-e.done)
		}
		return errors.Join(errs...)
	}
}
