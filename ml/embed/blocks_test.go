package embed

import (
	"slices"
	"testing"
)

// A frozen view keeps the values of its moment: the column copies a
// block the view shares before writing into it, only that block, and
// once.
func TestFrozenColumnKeepsItsValuesWhileTheColumnChanges(t *testing.T) {
	c := newColumn[int64](2)
	for i := range 2*blockRows + 1 {
		copy(c.mut(c.add()), []int64{int64(i), -int64(i)})
	}
	v := c.freeze()
	block0, block1 := &c.blocks[0][0], &c.blocks[1][0]
	copy(c.mut(blockRows+3), []int64{7, 7}) // block 1: copied
	copy(c.mut(blockRows+4), []int64{8, 8}) // block 1 again: already the column's own
	copy(c.mut(c.add()), []int64{9, 9})     // a new row after the freeze
	if &c.blocks[0][0] != block0 {
		t.Fatal("a block nothing wrote into was copied")
	}
	if &c.blocks[1][0] == block1 {
		t.Fatal("the column wrote into a block the view shares")
	}
	if cap(c.blocks[1]) != blockRows*2 {
		t.Fatalf("a copied block has room for %d values, want a full block's %d", cap(c.blocks[1]), blockRows*2)
	}
	if got := v.at(blockRows + 3); !slices.Equal(got, []int64{blockRows + 3, -(blockRows + 3)}) {
		t.Fatalf("view's row changed to %v", got)
	}
	if got := c.at(blockRows + 4); !slices.Equal(got, []int64{8, 8}) {
		t.Fatalf("column's row = %v, want [8 8]", got)
	}
	if v.n != 2*blockRows+1 || c.n != 2*blockRows+2 {
		t.Fatalf("view of %d rows, column of %d", v.n, c.n)
	}
	if got := c.at(blockRows + 3); !slices.Equal(got, []int64{7, 7}) {
		t.Fatalf("column's row = %v, want [7 7]", got)
	}
}

func TestColumnGrowthKeepsEarlierRowsInPlace(t *testing.T) {
	c := newColumn[float32](3)
	n := 3*blockRows + 5
	var firstOfBlock1 *float32
	for i := range n {
		s := c.add()
		if int(s) != i {
			t.Fatalf("row %d got slot %d", i, s)
		}
		r := c.at(s)
		if len(r) != 3 || cap(r) != 3 {
			t.Fatalf("row %d: len %d cap %d, want 3 and 3", i, len(r), cap(r))
		}
		for j := range r {
			r[j] = float32(i*3 + j)
		}
		if i == blockRows {
			firstOfBlock1 = &r[0]
		}
	}
	if got := &c.at(blockRows)[0]; got != firstOfBlock1 {
		t.Fatal("a row of a full block moved as the column grew")
	}
	for i := range n {
		if r := c.at(int32(i)); r[0] != float32(i*3) || r[2] != float32(i*3+2) {
			t.Fatalf("row %d = %v after growth", i, r)
		}
	}
	if len(c.blocks) != 4 {
		t.Fatalf("%d blocks for %d rows, want 4", len(c.blocks), n)
	}
	for b, blk := range c.blocks {
		if cap(blk) != blockRows*3 {
			t.Fatalf("block %d has capacity %d values, want %d", b, cap(blk), blockRows*3)
		}
	}
}

func TestColumnOfAFewRowsIsSmall(t *testing.T) {
	c := newColumn[int64](1)
	for range 10 {
		c.add()
	}
	if len(c.blocks) != 1 || cap(c.blocks[0]) != firstBlockRows {
		t.Fatalf("10 rows take %d blocks, the first of capacity %d; want 1 of %d", len(c.blocks), cap(c.blocks[0]), firstBlockRows)
	}
	for range blockRows {
		c.add()
	}
	if len(c.blocks) != 2 || cap(c.blocks[0]) != blockRows {
		t.Fatalf("after %d rows: %d blocks, the first of capacity %d; want 2, the first full", c.n, len(c.blocks), cap(c.blocks[0]))
	}
}

func TestColumnOfNoWidthCountsRows(t *testing.T) {
	c := newColumn[float32](0)
	for range 3 {
		c.add()
	}
	if c.n != 3 || c.at(2) != nil || c.mut(1) != nil || c.freeze().at(2) != nil {
		t.Fatalf("column of width 0: %d rows, at %v", c.n, c.at(2))
	}
}

func TestTableRowsKeepTheirValuesAcrossBlocks(t *testing.T) {
	tb := newTable(t, TableConfig{Dim: 2, Rule: Rule{Kind: Adagrad, LR: 0.5, InitAcc: 0.1, Eps: 1e-8}})
	keys := make([]uint64, 2*blockRows+3)
	for i := range keys {
		keys[i] = uint64(i*7 + 1)
	}
	out := make([]float32, len(keys)*2)
	if err := tb.Pull(1, keys, out); err != nil {
		t.Fatal(err)
	}
	grads := make([]float32, len(keys)*2)
	for i := range grads {
		grads[i] = 1
	}
	if err := tb.Push(1, keys, grads); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, 2)
	for i, k := range keys {
		row, state, ok := tb.Row(k)
		if !ok {
			t.Fatalf("key %d has no row", k)
		}
		copy(want, out[i*2:(i+1)*2])
		if err := tb.cfg.Rule.Apply(want, []float32{0.1, 0.1}, []float32{1, 1}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(row, want) || len(state) != 2 {
			t.Fatalf("key %d: row %v state %v, want row %v", k, row, state, want)
		}
	}
}

// A table frozen, then trained, evicted and grown, still lists the rows
// and free slots of the moment it was frozen.
func TestFrozenTableKeepsItsSlots(t *testing.T) {
	tb := newTable(t, TableConfig{Dim: 2, EvictAfter: 1})
	out := make([]float32, 2*2)
	if err := tb.Pull(1, []uint64{5, 6}, out); err != nil {
		t.Fatal(err)
	}
	fz := tb.Freeze()
	if err := tb.Push(1, []uint64{5}, []float32{1, 1}); err != nil {
		t.Fatal(err)
	}
	tb.Evict(3)
	if err := tb.Pull(3, []uint64{9}, out[:2]); err != nil { // into a freed slot
		t.Fatal(err)
	}
	if fz.Len() != 2 || len(fz.Free()) != 0 || fz.Key(0) != 5 || fz.Key(1) != 6 {
		t.Fatalf("frozen slots: %d, free %v, keys %d %d", fz.Len(), fz.Free(), fz.Key(0), fz.Key(1))
	}
	want := make([]float32, 2)
	InitRow(tb.cfg.Seed, tb.cfg.Name, 5, want)
	if !slices.Equal(fz.Row(0), want) {
		t.Fatalf("frozen row of key 5 = %v, want its value before the push %v", fz.Row(0), want)
	}
	if row, _, _ := tb.Row(5); row != nil {
		t.Fatalf("key 5 was evicted, still has row %v", row)
	}
	if fz.LastSeen(0) != 1 || fz.LastSeen(1) != 1 {
		t.Fatalf("frozen last sightings %d %d, want both of step 1 (the push and the eviction came after)", fz.LastSeen(0), fz.LastSeen(1))
	}
}

// A row sighted after a freeze writes its last sighting into a copy of
// the block: the frozen view keeps the step it had.
func TestFrozenLastSightingsStay(t *testing.T) {
	tb := newTable(t, TableConfig{Dim: 2, EvictAfter: 10})
	out := make([]float32, 2*2)
	if err := tb.Pull(1, []uint64{5, 6}, out); err != nil {
		t.Fatal(err)
	}
	fz := tb.Freeze()
	if err := tb.Pull(4, []uint64{5}, out[:2]); err != nil {
		t.Fatal(err)
	}
	if fz.LastSeen(0) != 1 || tb.lastSeen.at(0)[0] != 4 {
		t.Fatalf("key 5 last seen at %d in the frozen view and %d in the table, want 1 and 4", fz.LastSeen(0), tb.lastSeen.at(0)[0])
	}
}

func TestEvictedSlotsAreReused(t *testing.T) {
	tb := newTable(t, TableConfig{EvictAfter: 1})
	out := make([]float32, 4*3)
	if err := tb.Pull(1, []uint64{1, 2, 3}, out); err != nil {
		t.Fatal(err)
	}
	if n := tb.Evict(5); n != 3 {
		t.Fatalf("evicted %d, want 3", n)
	}
	if err := tb.Pull(5, []uint64{4, 5, 6}, out); err != nil {
		t.Fatal(err)
	}
	if tb.rows.n != 3 || tb.Len() != 3 {
		t.Fatalf("%d slots for %d rows after eviction and 3 new rows, want 3", tb.rows.n, tb.Len())
	}
	want := make([]float32, 4)
	InitRow(tb.cfg.Seed, tb.cfg.Name, 5, want)
	if row, _, _ := tb.Row(5); !slices.Equal(row, want) {
		t.Fatalf("row of key 5 in a reused slot = %v, want its initial %v", row, want)
	}
}

// A row made in a freed slot after a freeze writes its key into a copy
// of the block: the frozen view keeps the evicted rows' keys.
func TestFrozenKeysSurviveASlotReused(t *testing.T) {
	tb := newTable(t, TableConfig{Dim: 2, EvictAfter: 1})
	out := make([]float32, 2*2)
	if err := tb.Pull(1, []uint64{5, 6}, out); err != nil {
		t.Fatal(err)
	}
	if n := tb.Evict(3); n != 2 {
		t.Fatalf("evicted %d rows, want 2", n)
	}
	fz := tb.Freeze()
	if err := tb.Pull(3, []uint64{9}, out[:2]); err != nil { // into a freed slot
		t.Fatal(err)
	}
	if fz.Key(0) != 5 || fz.Key(1) != 6 {
		t.Fatalf("frozen keys %d %d after a freed slot was reused, want 5 6", fz.Key(0), fz.Key(1))
	}
	if _, _, ok := tb.Row(9); !ok {
		t.Fatal("key 9 has no row")
	}
}
