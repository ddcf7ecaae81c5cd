package worker

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/ps"
)

// The forward pass from the shards that answer first (docs/scaling.md,
// "The levers in the code"). With early pushes (early.go) the shard of the first
// layer's later rows completes its step before the shard of row 0, which
// still sums and applies the step's last gradients, and answers the next
// step's pull first. The forward pass's first product splits by the same
// rows (nn.Net.ForwardRows), so a sync worker loads its next batch and
// computes the part of the product those shards hold while it waits for
// the others: on a core the barrier would otherwise leave idle.
//
// It is a guess: the answers may turn out not to be the step's (ps.Align
// asks for another round, a catch-up, or says done) and the data position
// may move. Then what was computed is dropped (nn.Net.Forget), the data
// source goes back, and the step computes in full. The step's numbers
// never depend on it: the net computes the same blocks in the same order
// either way.

// ahead is a worker's state for starting steps ahead.
type ahead struct {
	blocks []aheadBlock // the first layer's row blocks above row 0's, top first

	mu         sync.Mutex // the pulls of a round answer on goroutines of their own
	open       bool       // in a pullAll's first round
	answered   []bool     // by shard: answered in that round
	blocksDone int        // blocks computed ahead, from the top
	loaded     bool       // the batch at the data position w.next is in the net's input
	valid      bool       // the round was the step's: what was computed stands if the batch does
	count      atomic.Int64
}

// aheadBlock is rows row and up (to the block above) of the first
// variable, and the shards that hold them.
type aheadBlock struct {
	row    int
	shards []int
}

// aheadPlan is the blocks of the first variable split at rows (earlyPlan's,
// ascending), top first, each with the shards holding some of its rows.
func aheadPlan(p partition.Plan, rows []int) []aheadBlock {
	var blocks []aheadBlock
	hi := -1 // the block above's first row; -1: the variable's end
	for i := len(rows) - 1; i >= 0; i-- {
		lo := rows[i]
		var shards []int
		for s, sh := range p.Shards {
			for _, b := range sh.Blocks {
				if b.Var == 0 && b.RowEnd > lo && (hi < 0 || b.RowStart < hi) {
					shards = append(shards, s)
					break
				}
			}
		}
		blocks = append(blocks, aheadBlock{row: lo, shards: shards})
		hi = lo
	}
	return blocks
}

// AheadSteps is how many steps the worker started ahead: part of the
// forward pass computed from the shards that answered first, and used.
func (w *Worker) AheadSteps() int64 {
	if w.ahead == nil {
		return 0
	}
	return w.ahead.count.Load()
}

// setupAhead turns starting ahead on for a worker that pushes early (the
// net splits its first product at the same rows).
//
// The batch is loaded after a shard answered the pull round of the step
// that trains on it, as the step's own load would be (a batch loaded in
// an earlier round is dropped), so under an elastic run's data plan
// both read the same plan: no shard answers a pull of a new era's first
// step before every worker acknowledged the plan that adds the era
// (docs/elastic.md), and a plan changes no position before that step.
func (w *Worker) setupAhead() {
	if w.early == nil {
		return
	}
	w.ahead = &ahead{blocks: aheadPlan(w.cfg.Plan, w.early.rows), answered: make([]bool, len(w.cfg.Shards))}
}

// aheadOpen starts a pullAll's first round: whatever an earlier round
// computed or loaded is dropped (its parameters are about to be
// overwritten, and its batch was read before this round's answers).
func (w *Worker) aheadOpen() {
	a := w.ahead
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.open, a.blocksDone, a.valid = true, 0, false
	clear(a.answered)
	w.cfg.Net.Forget()
	w.unloadAhead()
}

// unloadAhead puts the data source back where it was before a batch was
// loaded ahead (it is at w.next + 1 then). Call with a.mu held, or where
// no pull is under way.
func (w *Worker) unloadAhead() {
	if a := w.ahead; a.loaded {
		a.loaded = false
		w.cfg.Batches.SeekBatch(w.next)
	}
}

// aheadAnswered notes that shard s answered the first round with
// parameters (now in the net) and computes the blocks whose shards have
// all answered, top down, loading the batch at the data position first.
// Nothing before the worker knows its data position (its first step).
func (w *Worker) aheadAnswered(s int) {
	a := w.ahead
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.open {
		return
	}
	a.answered[s] = true
	for a.blocksDone < len(a.blocks) && !slices.ContainsFunc(a.blocks[a.blocksDone].shards, func(s int) bool { return !a.answered[s] }) {
		if !a.loaded {
			if w.next < 0 {
				return
			}
			w.cfg.Batches.Next(w.cfg.Net.Input(), w.labels)
			a.loaded = true
		}
		if !w.cfg.Net.ForwardRows(a.blocks[a.blocksDone].row) {
			return
		}
		a.blocksDone++
	}
}

// aheadClose ends a pullAll's first round with what ps.Align made of
// its answers: only a step on them keeps what was computed (another
// round may overwrite the parameters it read).
func (w *Worker) aheadClose(al ps.Alignment) {
	a := w.ahead
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.open = false
	a.valid = al.Action == ps.AlignStep
	if !a.valid {
		w.cfg.Net.Forget()
	}
}

// takeAhead says whether the step at data position pos can start from
// what was done ahead: the batch at pos is in the net's input (and
// w.labels), with part of the first product maybe computed. If not,
// anything done ahead is dropped and the data source is back at w.next.
func (w *Worker) takeAhead(pos int64) bool {
	a := w.ahead
	if a == nil || !a.loaded {
		return false
	}
	if a.valid && w.next == pos {
		a.loaded, a.valid = false, false
		if a.blocksDone > 0 {
			a.count.Add(1)
		}
		return true
	}
	a.valid = false
	w.cfg.Net.Forget()
	w.unloadAhead()
	return false
}
