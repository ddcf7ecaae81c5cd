package worker

import (
	"slices"

	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/ps"
)

// The step started ahead: the forward pass from the shards that answer
// first (docs/scaling.md, "The levers in the code"). With early pushes
// (early_push.go) the shard of the first layer's later rows completes
// its step before the shard of row 0, which still sums and applies the
// step's last gradients, and answers the next step's pull first. The
// forward pass's first product splits by the same rows
// (nn.Net.ForwardRows), so a sync worker loads its next batch and
// computes the part of the product those shards hold while it waits for
// the others: on a core the barrier would otherwise leave idle.
//
// It is a guess: the answers may turn out not to be the step's (ps.Align
// asks for another round, a catch-up, or says done) and the data
// position may move. Then what was computed is dropped (Forget), the
// data source goes back (Seek), and the step computes in full. The
// step's numbers never depend on it: the net computes the same blocks in
// the same order either way.
//
// The batch is loaded after a shard answered the pull round of the step
// that trains on it, as the step's own load would be (a batch loaded in
// an earlier round is dropped), so under an elastic run's data plan
// both read the same plan: no shard answers a pull of a new era's first
// step before every worker acknowledged the plan that adds the era
// (docs/elastic.md), and a plan changes no position before that step.

// headBlock is rows row and up (to the block above) of the first
// variable, and the shards that hold them.
type headBlock struct {
	row    int
	shards []int
}

// headStartPlan is the blocks of the first variable split at rows
// (earlyPlan's, ascending), top first, each with the shards holding some
// of its rows.
func headStartPlan(p partition.Plan, rows []int) []headBlock {
	var blocks []headBlock
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
		blocks = append(blocks, headBlock{row: lo, shards: shards})
		hi = lo
	}
	return blocks
}

// headStart is the core's state for starting steps ahead.
type headStart struct {
	blocks  []headBlock // nil: steps never start ahead
	inFirst bool        // in a step's first pull round
	heard   []bool      // by shard: answered in that round
	done    int         // blocks computed ahead, from the top
	loaded  bool        // the batch at the data position is in the net's input
	valid   bool        // the round was the step's: what was computed stands if the batch does
	busy    bool        // a HeadStart is being computed
	used    bool        // the last step started from it
	count   int64       // steps started ahead
}

func newHeadStart(p CoreParams) headStart {
	if len(p.HeadStart) == 0 {
		return headStart{}
	}
	return headStart{blocks: p.HeadStart, heard: make([]bool, p.Shards)}
}

// open starts a step's first pull round: whatever an earlier round
// computed or loaded is dropped (next: the data position the source
// goes back to).
func (h *headStart) open(next int64) []Action {
	if h.blocks == nil {
		return nil
	}
	h.inFirst, h.done, h.valid = true, 0, false
	clear(h.heard)
	return append([]Action{Forget{}}, h.unload(next)...)
}

// unload puts the data source back where it was before a batch was
// loaded ahead (it is one past next then).
func (h *headStart) unload(next int64) []Action {
	if !h.loaded {
		return nil
	}
	h.loaded = false
	return []Action{Seek{Position: next}}
}

// answered notes that shard s answered the first round with parameters
// and computes the blocks whose shards have all answered, top down,
// loading the batch at the data position first. Nothing before the
// worker knows its data position (next < 0: its first step).
func (h *headStart) answered(s int, next int64) []Action {
	if h.blocks == nil || !h.inFirst {
		return nil
	}
	h.heard[s] = true
	var rows []int
	for i := h.done; i < len(h.blocks) && !slices.ContainsFunc(h.blocks[i].shards, func(s int) bool { return !h.heard[s] }); i++ {
		rows = append(rows, h.blocks[i].row)
	}
	if len(rows) == 0 || (!h.loaded && next < 0) {
		return nil
	}
	load := !h.loaded
	h.loaded, h.busy = true, true
	return []Action{HeadStart{Load: load, Rows: rows}}
}

// computed is a HeadStart's end: n blocks computed.
func (h *headStart) computed(n int) {
	h.busy = false
	h.done += n
}

// close ends a step's first round with what ps.Align made of its
// answers: only a step on them keeps what was computed (another round
// may overwrite the parameters it read).
func (h *headStart) close(a ps.Alignment) []Action {
	if h.blocks == nil {
		return nil
	}
	h.inFirst = false
	h.valid = a.Action == ps.AlignStep
	if !h.valid {
		return []Action{Forget{}}
	}
	return nil
}

// take says whether the passes on the batch at data position pos can
// start from what was done ahead: the batch at pos is in the net's
// input, with part of the first product maybe computed. If not, anything
// done ahead is dropped and the data source goes back to next. step
// says the passes are a step's (not a catch-up's).
func (h *headStart) take(pos, next int64, step bool) (bool, []Action) {
	h.used = false
	if !h.loaded {
		return false, nil
	}
	if h.valid && next == pos {
		h.loaded, h.valid = false, false
		if h.done > 0 && step {
			h.used = true
			h.count++
		}
		return true, nil
	}
	h.valid = false
	return false, append([]Action{Forget{}}, h.unload(next)...)
}
