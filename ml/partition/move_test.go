package partition

import (
	"testing"

	"github.com/pstrain/pstrain/ml/model"
)

// TestMovesCoverEveryRowOnce: for every change of count among 1..4
// shards of two models, the moves cover every row of every variable
// exactly once, each from the shard of the old plan that holds it to the
// one of the new plan that does, and moving the old shards' buffers by
// them gives the new shards' buffers.
func TestMovesCoverEveryRowOnce(t *testing.T) {
	for _, spec := range []model.Spec{
		{Input: 784, Hidden: []int{800}, Classes: 10},
		{Input: 784, Hidden: []int{256, 128}, Classes: 10},
	} {
		vars := spec.Init(3)
		for a := 1; a <= 4; a++ {
			for b := 1; b <= 4; b++ {
				checkMoves(t, spec, vars, a, b)
			}
		}
	}
}

func checkMoves(t *testing.T, spec model.Spec, vars [][]float32, a, b int) {
	t.Helper()
	old, err := New(spec, a)
	if err != nil {
		t.Fatal(err)
	}
	nw, err := New(spec, b)
	if err != nil {
		t.Fatal(err)
	}
	moves := Moves(old, nw)
	seen := make([][]int, len(vars))
	for v := range vars {
		seen[v] = make([]int, old.Vars[v].Rows)
	}
	// The variables rebuilt from the old shards' buffers through the moves.
	oldBufs := make([][]float32, a)
	for s := range a {
		oldBufs[s] = make([]float32, old.Shards[s].Size)
		old.Gather(s, vars, oldBufs[s])
	}
	rebuilt := make([][]float32, len(vars))
	for v := range vars {
		rebuilt[v] = make([]float32, len(vars[v]))
	}
	for _, m := range moves {
		if rowOwners(old, m.Block.Var, old.Vars[m.Block.Var].Rows)[m.Block.RowStart] != m.From ||
			rowOwners(nw, m.Block.Var, nw.Vars[m.Block.Var].Rows)[m.Block.RowEnd-1] != m.To {
			t.Fatalf("%d -> %d shards: move %+v names the wrong shards", a, b, m)
		}
		cols := old.Vars[m.Block.Var].Cols
		off := offsetOf(old, m.From, m.Block)
		copy(rebuilt[m.Block.Var][m.Block.RowStart*cols:m.Block.RowEnd*cols], oldBufs[m.From][off:off+m.Elements])
		for r := m.Block.RowStart; r < m.Block.RowEnd; r++ {
			seen[m.Block.Var][r]++
		}
	}
	for v := range seen {
		for r, n := range seen[v] {
			if n != 1 {
				t.Fatalf("%d -> %d shards: row %d of variable %d in %d moves", a, b, r, v, n)
			}
		}
	}
	for s := range b {
		want, got := make([]float32, nw.Shards[s].Size), make([]float32, nw.Shards[s].Size)
		nw.Gather(s, vars, want)
		nw.Gather(s, rebuilt, got)
		for i := range want {
			if want[i] != got[i] {
				t.Fatalf("%d -> %d shards: new shard %d differs at %d", a, b, s, i)
			}
		}
	}
	if a == b && MovedElements(moves) != 0 {
		t.Errorf("%d -> %d shards: %d elements moved, want none", a, b, MovedElements(moves))
	}
}

// offsetOf is where block b starts in shard s's flat buffer of p.
func offsetOf(p Plan, s int, b Block) int {
	off := 0
	for _, x := range p.Shards[s].Blocks {
		cols := p.Vars[x.Var].Cols
		if x.Var == b.Var && b.RowStart >= x.RowStart && b.RowStart < x.RowEnd {
			return off + (b.RowStart-x.RowStart)*cols
		}
		off += (x.RowEnd - x.RowStart) * cols
	}
	panic("block not on shard")
}

// TestMovesOfTheDefaultMLP pins the plan of the default model's 2 -> 3
// and 3 -> 1 changes: the rows that change shards.
func TestMovesOfTheDefaultMLP(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	p := map[int]Plan{}
	for _, n := range []int{1, 2, 3} {
		var err error
		if p[n], err = New(spec, n); err != nil {
			t.Fatal(err)
		}
	}
	total := p[1].Shards[0].Size
	for _, c := range []struct{ a, b int }{{2, 3}, {3, 1}, {1, 2}} {
		ms := Moves(p[c.a], p[c.b])
		moved := MovedElements(ms)
		t.Logf("%d -> %d PS: %d moves, %d of %d elements change shards (%.0f%%)", c.a, c.b, len(ms), moved, total, 100*float64(moved)/float64(total))
		if moved <= 0 || moved > total {
			t.Errorf("%d -> %d PS: %d elements moved of %d", c.a, c.b, moved, total)
		}
	}
	// Down to one shard: everything not on shard 0 moves there.
	if got, want := MovedElements(Moves(p[3], p[1])), total-p[3].Shards[0].Size; got != want {
		t.Errorf("3 -> 1 PS moves %d elements, want the %d of shards 1 and 2", got, want)
	}
}
