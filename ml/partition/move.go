package partition

// Move is a run of rows of one variable that a change of layout takes
// from shard From of the old plan to shard To of the new one (From ==
// To: the rows stay on the same shard index, though maybe at another
// offset of its flat buffer).
type Move struct {
	From, To int
	Block    Block
	// Elements is the block's float32 elements (rows times columns).
	Elements int
}

// Moves is the plan of a change of layout from old to new, two plans of
// the same variables: for every row of every variable, which shard holds
// it before and which after, as maximal runs of rows, in variable and row
// order. Every row is in exactly one move.
func Moves(old, new Plan) []Move {
	var out []Move
	for v, variable := range old.Vars {
		from, to := rowOwners(old, v, variable.Rows), rowOwners(new, v, variable.Rows)
		start := 0
		for r := 1; r <= variable.Rows; r++ {
			if r < variable.Rows && from[r] == from[start] && to[r] == to[start] {
				continue
			}
			out = append(out, Move{From: from[start], To: to[start], Block: Block{Var: v, RowStart: start, RowEnd: r},
				Elements: (r - start) * variable.Cols})
			start = r
		}
	}
	return out
}

// rowOwners is, for each of variable v's rows, the shard of p that
// holds it.
func rowOwners(p Plan, v, rows int) []int {
	owner := make([]int, rows)
	for s, sh := range p.Shards {
		for _, b := range sh.Blocks {
			if b.Var != v {
				continue
			}
			for r := b.RowStart; r < b.RowEnd; r++ {
				owner[r] = s
			}
		}
	}
	return owner
}

// MovedElements is the elements of moves that change shards (From !=
// To): what a change of layout carries between parameter servers.
func MovedElements(moves []Move) int {
	n := 0
	for _, m := range moves {
		if m.From != m.To {
			n += m.Elements
		}
	}
	return n
}
