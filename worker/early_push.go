package worker

import (
	"math"
	"slices"

	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/ps"
)

// Early pushes (wait-free backpropagation at the shard boundaries;
// docs/scaling.md, "The levers in the code"). The backward pass ends
// with the first layer's weight gradient, the step's largest product,
// and the shards hold that variable in blocks of rows (partition.Plan).
// A sync worker has the net compute it in row blocks, last first
// (nn.Net.SetEarlyRows), and pushes each shard as soon as every row and
// variable it holds is final (Core.RowsFinal), while the net computes
// the rows below. The shard that holds row 0 goes with the step's other
// pushes. The gradient and the semantics of a step are the same; a
// shard's work on the push runs while the worker still computes, on a
// core the sync barrier would otherwise leave idle.

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

// earlyPushes is the core's state for early pushes: armed for a step's
// passes, the shards pushed so far in them.
type earlyPushes struct {
	rows  []int
	final [][]int // by row block: the shards final at its announcement
	armed bool
	tags  []ps.PullView // the step's views, the pushes' tags
	sent  []bool        // by shard: pushed early this step
	count int64         // shards pushed early, all steps
}

func newEarlyPushes(p CoreParams) earlyPushes {
	if len(p.EarlyRows) == 0 {
		return earlyPushes{}
	}
	return earlyPushes{rows: p.EarlyRows, final: p.EarlyReady, tags: make([]ps.PullView, p.Shards), sent: make([]bool, p.Shards)}
}

// arm lets the step's passes push shards early, tagged with views.
func (e *earlyPushes) arm(views []ps.PullView) {
	if e.rows == nil {
		return
	}
	e.armed = true
	copy(e.tags, views)
	clear(e.sent)
}

// disarm ends what arm allowed (announcements of a catch-up gradient's
// passes push nothing) and says which shards went early.
func (e *earlyPushes) disarm() (sent []bool) {
	e.armed = false
	return e.sent
}

// ready is the shards the announcement of row lets go, marked sent.
func (e *earlyPushes) ready(row int) []int {
	if !e.armed {
		return nil
	}
	i, ok := slices.BinarySearch(e.rows, row)
	if !ok || len(e.final[i]) == 0 {
		return nil
	}
	shards := e.final[i]
	for _, s := range shards {
		e.sent[s] = true
	}
	e.count += int64(len(shards))
	return shards
}
