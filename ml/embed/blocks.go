package embed

import "slices"

// blockRows is how many rows a full block of a column holds.
const blockRows = 1024

// firstBlockRows is the capacity, in rows, a column's first block starts
// with: a table of a few rows (a field of ten values) takes little.
const firstBlockRows = 16

// column is one per-row field of a table (the rows' values, their
// optimizer state, their keys, their last sightings), width values a
// row, stored in blocks of blockRows rows. A full block is never
// reallocated: growth past it adds a block, so the rows of full blocks
// keep their addresses and a table's growth leaves no old array behind
// for the collector. Only the first block grows by doubling, from
// firstBlockRows rows up to a full block, so that a small table is
// small; the arrays it leaves behind total less than one block.
//
// A column can be frozen (freeze): the view it returns shares the
// blocks, and the column copies a shared block before it next writes
// into it (mut), so the view keeps the values of the moment it was taken
// while only the blocks written since cost a copy.
type column[T any] struct {
	width  int
	blocks [][]T  // every block but the last is full
	shared []bool // per block: a frozen view holds it, copy before writing
	n      int    // rows
}

// newColumn returns an empty column of width values a row.
func newColumn[T any](width int) column[T] {
	return column[T]{width: width}
}

// at is a row's values (nil when the width is 0).
func (c *column[T]) at(slot int32) []T {
	if c.width == 0 {
		return nil
	}
	b, i := int(slot)/blockRows, int(slot)%blockRows
	return c.blocks[b][i*c.width : (i+1)*c.width : (i+1)*c.width]
}

// add appends a row of zeros and returns its slot.
func (c *column[T]) add() int32 {
	s := int32(c.n)
	c.n++
	if c.width == 0 {
		return s
	}
	b := int(s) / blockRows
	if b == len(c.blocks) {
		rows := blockRows
		if b == 0 {
			rows = firstBlockRows
		}
		c.blocks = append(c.blocks, make([]T, 0, rows*c.width))
		c.shared = append(c.shared, false)
	}
	blk := c.blocks[b]
	if len(blk) == cap(blk) { // only the first block, below a full one
		grown := make([]T, len(blk), min(2*cap(blk), blockRows*c.width))
		copy(grown, blk)
		blk, c.shared[b] = grown, false
	}
	c.blocks[b] = blk[:len(blk)+c.width]
	return s
}

// mut is a row's values to write into: its block is first copied if a
// frozen view shares it.
func (c *column[T]) mut(slot int32) []T {
	if c.width == 0 {
		return nil
	}
	if b := int(slot) / blockRows; c.shared[b] {
		own := make([]T, len(c.blocks[b]), cap(c.blocks[b])) // the same room to grow into
		copy(own, c.blocks[b])
		c.blocks[b], c.shared[b] = own, false
	}
	return c.at(slot)
}

// freeze returns a view of the column's rows as they are now, which
// later writes do not change (mut copies the blocks it shares).
func (c *column[T]) freeze() view[T] {
	for b := range c.shared {
		c.shared[b] = true
	}
	return view[T]{width: c.width, blocks: slices.Clone(c.blocks), n: c.n}
}

// view is a frozen column's rows.
type view[T any] struct {
	width  int
	blocks [][]T
	n      int
}

// at is a row's values in the view (nil when the width is 0).
func (v view[T]) at(slot int) []T {
	if v.width == 0 {
		return nil
	}
	b, i := slot/blockRows, slot%blockRows
	return v.blocks[b][i*v.width : (i+1)*v.width : (i+1)*v.width]
}
