package embed

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// TableConfig describes one embedding table.
type TableConfig struct {
	Name string // the table's name, e.g. "emb/C1": it seeds the rows and places them
	Dim  int    // values per row
	Seed uint64 // the run's seed
	Rule Rule   // how a row is trained
	// AdmitAfter is how many sightings a key needs before it gets a row of
	// its own (0 or 1: at once). Until then it reads its initial value and
	// its gradients are dropped.
	AdmitAfter int
	// EvictAfter drops, at Evict, the rows unseen for more than this many
	// steps (0: never).
	EvictAfter int64
}

// MaxDim bounds a table's dimension: far beyond what CTR models use (8
// to 128), and small enough that a row fits any message. Rows are
// allocated in blocks of the dimension's values, so a dimension near
// 2^31 would ask for gigabytes at the first row.
const MaxDim = 4096

// Validate says what is wrong with a table's configuration.
func (c TableConfig) Validate() error {
	if c.Name == "" {
		return fmt.Errorf("embed: a table needs a name")
	}
	if c.Dim <= 0 || c.Dim > MaxDim {
		return fmt.Errorf("embed: table %s: dimension %d: want 1 to %d", c.Name, c.Dim, MaxDim)
	}
	if c.AdmitAfter < 0 || c.EvictAfter < 0 {
		return fmt.Errorf("embed: table %s: admission %d and eviction %d must not be negative", c.Name, c.AdmitAfter, c.EvictAfter)
	}
	if err := c.Rule.Validate(); err != nil {
		return fmt.Errorf("table %s: %w", c.Name, err)
	}
	return nil
}

// TableStats counts what happened to a table's rows.
type TableStats struct {
	Rows       int   // rows held now
	Admissions int64 // rows created
	Evictions  int64 // rows dropped by Evict
	Dropped    int64 // gradients of keys without a row, dropped
}

// Table is one embedding table's rows, created on first touch (after
// admission) with InitRow and trained with the table's Rule. Rows live in
// slots of columns stored in fixed-size blocks (column): a table of many
// small rows costs one allocation per block of rows, not one per row,
// and growing adds a block without copying or leaving behind the rows
// before. An index (index.go) finds a key's slot. A Table is not safe for
// concurrent use: its holder serialises calls.
type Table struct {
	cfg      TableConfig
	idx      index                // key -> slot
	rows     column[float32]      // slot -> its record: key, row, optimizer state
	lastSeen column[int64]        // slot -> step of the last pull or push (only if it evicts)
	free     []int32              // slots of evicted rows
	seen     map[uint64]sightings // keys not yet admitted
	stats    TableStats
	found    []int32 // lookup's scratch
	writes   uint64  // rows written, created or dropped (Writes)
	drops    uint64  // rows dropped (Drops)
	hinted   int64   // slots taken from hints (Hinted)
}

// NewTable returns an empty table.
func NewTable(cfg TableConfig) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Table{cfg: cfg, seen: map[uint64]sightings{}, idx: index{seed: rand.Uint64()},
		rows:     newColumn[float32](keyWords + cfg.Dim + cfg.Rule.StateLen(cfg.Dim)),
		lastSeen: newColumn[int64](seenWidth(cfg))}, nil
}

// A row's key, its values and its optimizer state are one record of the
// rows column, in that order: a step that touches a row reads its key
// (to find its slot, index.go) and reads and writes its values and
// state, and on tables far larger than the caches each of the three
// apart would be a miss of its own (BenchmarkTableStep in ps).

// keyWords is the float32 words at the start of a record that hold its
// key's bits.
const keyWords = 2

// putKey writes k's bits into a record's key words.
func putKey(rec []float32, k uint64) {
	rec[0], rec[1] = math.Float32frombits(uint32(k)), math.Float32frombits(uint32(k>>32))
}

// recordKey is the key a record's key words hold.
func recordKey(rec []float32) uint64 {
	return uint64(math.Float32bits(rec[0])) | uint64(math.Float32bits(rec[1]))<<32
}

// splitRecord is a record's row and state.
func splitRecord(rec []float32, dim int) (row, state []float32) {
	return rec[keyWords : keyWords+dim : keyWords+dim], rec[keyWords+dim:]
}

// value is slot's row.
func (t *Table) value(s int32) []float32 {
	row, _ := splitRecord(t.rows.at(s), t.cfg.Dim)
	return row
}

// mutRecord is slot's row and state to write into.
func (t *Table) mutRecord(s int32) (row, state []float32) {
	t.writes++
	return splitRecord(t.rows.mut(s), t.cfg.Dim)
}

// Writes counts the table's changes of a checkpoint's contents: rows
// created, written or dropped. Two equal counts with no call between
// that returned an error mean the table's keys, rows and state are
// unchanged; a sighting, which checkpoints do not hold, is no change.
func (t *Table) Writes() uint64 { return t.writes }

// seenWidth is the last-sighting column's width: a table that evicts
// nothing keeps no sightings.
func seenWidth(cfg TableConfig) int {
	if cfg.EvictAfter > 0 {
		return 1
	}
	return 0
}

// see records a pull or push of slot at step; only eviction reads it.
func (t *Table) see(s int32, step int64) {
	if t.cfg.EvictAfter > 0 {
		t.lastSeen.mut(s)[0] = step
	}
}

// sightings counts a key not yet admitted: how often, and the step of the
// last time (Evict forgets it as it drops a row).
type sightings struct {
	n    int32
	last int64
}

// seenBytes is about what a key waiting for admission takes in the map.
const seenBytes = 32

// Config returns the table's configuration.
func (t *Table) Config() TableConfig { return t.cfg }

// Len is the number of rows held.
func (t *Table) Len() int { return t.idx.n }

// slot is k's slot, if it has a row.
func (t *Table) slot(k uint64) (int32, bool) { return t.idx.get(k, &t.rows) }

// Bytes is what the rows (keys, values and optimizer state) take in
// memory, with the keys waiting for admission; the key index (index.go,
// about 8 to 16 bytes a key) is not counted.
func (t *Table) Bytes() int64 {
	return int64(t.idx.n)*RowBytes(t.cfg) + int64(len(t.seen))*seenBytes
}

// RowBytes is what one row of a table of cfg takes in memory: its key,
// values, optimizer state and (if the table evicts) last sighting; the
// key index is not counted.
func RowBytes(cfg TableConfig) int64 {
	return int64(cfg.Dim+cfg.Rule.StateLen(cfg.Dim))*4 + 8 + 8*int64(seenWidth(cfg))
}

// Stats returns the table's counters.
func (t *Table) Stats() TableStats {
	s := t.stats
	s.Rows = t.idx.n
	return s
}

// Pull writes the rows of keys into out (len(keys)*Dim values), creating
// the rows of admitted keys seen for the first time. A pull is a sighting.
func (t *Table) Pull(step int64, keys []uint64, out []float32) error {
	return t.PullSlots(step, keys, out, nil)
}

// PullSlots is Pull that also writes each key's slot into slots (-1: no
// row, a key not admitted), unless slots is nil: hints for PushHinted.
func (t *Table) PullSlots(step int64, keys []uint64, out []float32, slots []int32) error {
	d := t.cfg.Dim
	if len(out) != len(keys)*d || (slots != nil && len(slots) != len(keys)) {
		return fmt.Errorf("embed: table %s: %d values for %d rows of dimension %d", t.cfg.Name, len(out), len(keys), d)
	}
	found := t.lookup(keys)
	for i, k := range keys {
		dst := out[i*d : (i+1)*d]
		s := found[i]
		if s < 0 { // not held when looked up: a new key, or one created since (keys repeated)
			var ok bool
			if s, ok = t.slot(k); !ok {
				if !t.admit(k, step) {
					InitRow(t.cfg.Seed, t.cfg.Name, k, dst)
					if slots != nil {
						slots[i] = -1
					}
					continue
				}
				s = t.create(k)
			}
		}
		t.see(s, step)
		copy(dst, t.value(s))
		if slots != nil {
			slots[i] = s
		}
	}
	return nil
}

// Hinted counts the keys whose slots PushHinted took from their hints
// rather than the index, since the table was made.
func (t *Table) Hinted() int64 { return t.hinted }

// Drops counts the rows the table ever dropped (evicted or not kept):
// slot hints taken at one count are good while it stays.
func (t *Table) Drops() uint64 { return t.drops }

// lookup is the slots of keys (-1: not held), in a scratch slice valid
// until the next call. The lookups run on their own, apart from the
// rows' work, so that the processor overlaps their cache misses: on
// tables far larger than the caches each is one (BenchmarkTableStep in
// ps). A probe reads the key at the start of the row's record, so the
// work then finds the record's first line in the cache.
func (t *Table) lookup(keys []uint64) []int32 {
	slots := t.scratch(len(keys))
	t.idx.getMany(keys, &t.rows, slots)
	return slots
}

// scratch is lookup's and resolve's slice of n slots, valid until the
// next call of either.
func (t *Table) scratch(n int) []int32 {
	if cap(t.found) < n {
		t.found = make([]int32, n)
	}
	return t.found[:n]
}

// resolve is lookup, taking the slots hints give where their records
// hold their keys (nil: none).
func (t *Table) resolve(keys []uint64, hints []int32) []int32 {
	if hints == nil {
		return t.lookup(keys)
	}
	slots := t.scratch(len(keys))
	var sink uint32
	var hinted int64
	for i, k := range keys {
		if s := hints[i]; s >= 0 && int(s) < t.rows.n {
			if rec := t.rows.at(s); recordKey(rec) == k {
				slots[i] = s
				hinted++
				sink ^= touch(rec)
				continue
			}
		}
		s, ok := t.slot(k)
		if !ok {
			s = -1
		}
		slots[i] = s
	}
	t.idx.sink ^= sink
	t.hinted += hinted
	return slots
}

// Peek writes the rows of keys into out like Pull, but creates no row
// and counts no sighting: a key without a row reads its initial value.
// It is how a model is evaluated without growing its tables. The keys
// are looked up together, as a pull's are (their cache misses overlap).
func (t *Table) Peek(keys []uint64, out []float32) error {
	d := t.cfg.Dim
	if len(out) != len(keys)*d {
		return fmt.Errorf("embed: table %s: %d values for %d rows of dimension %d", t.cfg.Name, len(out), len(keys), d)
	}
	for i, s := range t.lookup(keys) {
		dst := out[i*d : (i+1)*d]
		if s >= 0 {
			copy(dst, t.value(s))
		} else {
			InitRow(t.cfg.Seed, t.cfg.Name, keys[i], dst)
		}
	}
	return nil
}

// Push applies one gradient per key (keys unique, grads len(keys)*Dim) to
// the keys' rows. A key without a row (not admitted, or evicted since its
// pull) has its gradient dropped and counted.
func (t *Table) Push(step int64, keys []uint64, grads []float32) error {
	return t.PushHinted(step, keys, nil, 0, grads)
}

// PushHinted is Push with each key's slot as a pull found it (PullSlots;
// -1: not known), taken when Drops was since: a hint whose record still
// holds its key is the key's slot while no row was dropped, and saves
// the index's probe (a cache miss a key on large tables). Other keys,
// and every key once a row was dropped, are looked up.
func (t *Table) PushHinted(step int64, keys []uint64, hints []int32, since uint64, grads []float32) error {
	d := t.cfg.Dim
	if len(grads) != len(keys)*d || (hints != nil && len(hints) != len(keys)) {
		return fmt.Errorf("embed: table %s: %d gradient values for %d rows of dimension %d", t.cfg.Name, len(grads), len(keys), d)
	}
	if since != t.drops {
		hints = nil
	}
	slots := t.resolve(keys, hints)
	for i, s := range slots {
		if s < 0 {
			t.stats.Dropped++
			continue
		}
		row, state := t.mutRecord(s)
		if err := t.cfg.Rule.Apply(row, state, grads[i*d:(i+1)*d]); err != nil {
			return err
		}
		t.see(s, step)
	}
	return nil
}

// admit counts a sighting of a key without a row and says whether it now
// gets one.
func (t *Table) admit(k uint64, step int64) bool {
	if t.cfg.AdmitAfter <= 1 {
		return true
	}
	n := t.seen[k].n + 1
	if int(n) >= t.cfg.AdmitAfter {
		delete(t.seen, k)
		return true
	}
	t.seen[k] = sightings{n: n, last: step}
	return false
}

// create gives a key a slot holding its initial row and state.
func (t *Table) create(k uint64) int32 {
	s := t.place(k)
	row, state := t.mutRecord(s)
	InitRow(t.cfg.Seed, t.cfg.Name, k, row)
	t.cfg.Rule.InitState(state)
	t.stats.Admissions++
	return s
}

// Fill creates the rows of keys that have none as a first touch would
// (InitRow and the rule's first state, each counted as an admission),
// without the sightings admission asks for, and with step as their last
// sighting: a table pre-filled with rows (PrefillKey). It returns how
// many rows it created.
func (t *Table) Fill(keys []uint64, step int64) int {
	n := 0
	for _, k := range keys {
		if _, ok := t.slot(k); ok {
			continue
		}
		t.see(t.create(k), step)
		n++
	}
	return n
}

// place finds a slot for a key (a free one, or a new one at the end).
func (t *Table) place(k uint64) int32 {
	var s int32
	if n := len(t.free); n > 0 {
		s, t.free = t.free[n-1], t.free[:n-1]
	} else {
		s = t.rows.add()
		t.lastSeen.add()
	}
	t.writes++
	putKey(t.rows.mut(s), k)
	t.idx.put(k, s, &t.rows)
	return s
}

// Evict drops the rows unseen for more than EvictAfter steps before step,
// and returns how many it dropped; it forgets the sightings of keys not
// admitted that are as old, so their count starts again.
func (t *Table) Evict(step int64) int {
	if t.cfg.EvictAfter <= 0 {
		return 0
	}
	for k, s := range t.seen {
		if step-s.last > t.cfg.EvictAfter {
			delete(t.seen, k)
		}
	}
	var due []int32
	t.idx.each(func(s int32) {
		if step-t.lastSeen.at(s)[0] > t.cfg.EvictAfter {
			due = append(due, s)
		}
	})
	t.drop(due)
	t.stats.Evictions += int64(len(due))
	return len(due)
}

// drop frees the slots of rows, which the table holds.
func (t *Table) drop(slots []int32) {
	for _, s := range slots {
		t.idx.remove(recordKey(t.rows.at(s)), &t.rows)
	}
	t.free = append(t.free, slots...)
	t.writes += uint64(len(slots))
	t.drops += uint64(len(slots))
}

// Retain drops the rows of the keys keep refuses, and the sightings of
// such keys not admitted yet, and returns how many rows it dropped: a
// shard keeping the rows a new layout leaves on it. The dropped rows'
// slots are reused by the rows created after.
func (t *Table) Retain(keep func(k uint64) bool) int {
	for k := range t.seen {
		if !keep(k) {
			delete(t.seen, k)
		}
	}
	// The records in slot order, as they lie in memory (the index's
	// order would be a miss a row).
	free := make([]bool, t.rows.n)
	for _, s := range t.free {
		free[s] = true
	}
	var gone []int32
	for s := range int32(t.rows.n) {
		if !free[s] && !keep(recordKey(t.rows.at(s))) {
			gone = append(gone, s)
		}
	}
	t.drop(gone)
	return len(gone)
}

// Keys returns the keys held, in increasing order (the order checkpoints
// store rows in, so a checkpoint's bytes depend only on the rows).
func (t *Table) Keys() []uint64 {
	keys := make([]uint64, 0, t.idx.n)
	t.idx.each(func(s int32) { keys = append(keys, recordKey(t.rows.at(s))) })
	slices.Sort(keys)
	return keys
}

// Row returns a view of a key's row and optimizer state, valid until the
// table next changes; ok is false when the key has no row.
func (t *Table) Row(k uint64) (row, state []float32, ok bool) {
	s, ok := t.slot(k)
	if !ok {
		return nil, nil, false
	}
	row, state = splitRecord(t.rows.at(s), t.cfg.Dim)
	return row, state, true
}

// Put sets a key's row and state (a restore, or a row moved from another
// shard), creating the row if needed; step is its last sighting.
func (t *Table) Put(k uint64, step int64, row, state []float32) error {
	d, sl := t.cfg.Dim, t.cfg.Rule.StateLen(t.cfg.Dim)
	if len(row) != d || len(state) != sl {
		return fmt.Errorf("embed: table %s: row of %d and state of %d values, want %d and %d", t.cfg.Name, len(row), len(state), d, sl)
	}
	s, ok := t.slot(k)
	if !ok {
		s = t.place(k)
	}
	r, st := t.mutRecord(s)
	copy(r, row)
	copy(st, state)
	t.see(s, step)
	return nil
}

// Load adds rows (a restore, or rows moved from other shards): keys, in
// increasing order, their rows (len(keys)*Dim values) and optimizer
// state, step being their last sighting. A key the table holds already
// is refused unless its row and state are these, bit for bit (the same
// row loaded again, by a retried request, is no conflict); a refused
// load adds nothing. The keys are looked up before any row is added, so
// that their misses overlap (as Pull's), and the index makes room for
// the rows added at once (Reserve).
func (t *Table) Load(step int64, keys []uint64, rows, state []float32) error {
	d, sl := t.cfg.Dim, t.cfg.Rule.StateLen(t.cfg.Dim)
	if len(rows) != len(keys)*d || len(state) != len(keys)*sl {
		return fmt.Errorf("embed: table %s: %d values and %d state values for %d rows of dimension %d and %d state",
			t.cfg.Name, len(rows), len(state), len(keys), d, sl)
	}
	for i := 1; i < len(keys); i++ {
		if keys[i] <= keys[i-1] {
			return fmt.Errorf("embed: table %s: keys not increasing at row %d (%d after %d)", t.cfg.Name, i, keys[i], keys[i-1])
		}
	}
	slots := t.lookup(keys)
	for i, s := range slots {
		if s < 0 {
			continue
		}
		row, st := splitRecord(t.rows.at(s), d)
		if !sameBits(row, rows[i*d:(i+1)*d]) || !sameBits(st, state[i*sl:(i+1)*sl]) {
			return fmt.Errorf("embed: table %s: key %d is held already with another row: a row loaded from two places", t.cfg.Name, keys[i])
		}
	}
	adding := 0
	for _, s := range slots {
		if s < 0 {
			adding++
		}
	}
	t.Reserve(t.Len() + adding)
	for i, k := range keys {
		if slots[i] >= 0 {
			continue // held already, as loaded
		}
		s := t.place(k)
		r, st := t.mutRecord(s)
		copy(r, rows[i*d:(i+1)*d])
		copy(st, state[i*sl:(i+1)*sl])
		t.see(s, step)
	}
	return nil
}

// Reserve makes room in the table's index for n rows in all, the rows
// held among them, so that a load adding many rows does not rebuild the
// index at every doubling on the way (each rebuild reads the record of
// every key held). It changes no row.
func (t *Table) Reserve(n int) { t.idx.reserve(n, &t.rows) }

// sameBits says whether a and b hold the same float32 bits.
func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// Slots is a table's slots frozen at a moment (Table.Freeze): every
// slot's key, row and optimizer state, and which slots were free.
type Slots struct {
	Dim, StateLen int
	rows          view[float32] // each slot's record: key, row, state
	lastSeen      view[int64]   // each slot's last sighting (a table that evicts)
	free          []int32
}

// Len is the number of slots, free ones included.
func (s Slots) Len() int { return s.rows.n }

// Key, Row and State are a slot's key, row and optimizer state (not to
// be written into).
func (s Slots) Key(slot int) uint64 { return recordKey(s.rows.at(slot)) }
func (s Slots) Row(slot int) []float32 {
	row, _ := splitRecord(s.rows.at(slot), s.Dim)
	return row
}
func (s Slots) State(slot int) []float32 {
	_, state := splitRecord(s.rows.at(slot), s.Dim)
	return state
}

// LastSeen is a slot's last sighting (0: a table that evicts nothing).
func (s Slots) LastSeen(slot int) int64 {
	if v := s.lastSeen.at(slot); len(v) > 0 {
		return v[0]
	}
	return 0
}

// Free is the slots of evicted rows (not to be written into).
func (s Slots) Free() []int32 { return s.free }

// Freeze returns the table's slots as they are now, freed ones included:
// a view sharing the table's blocks, not a copy, so that its holder can
// snapshot the table under its lock in the time it takes to list the
// blocks and sort the rows out afterwards. The table copies a block the
// view shares before it next writes into it: the view costs the memory
// of the blocks written while it is held, not of the whole table.
func (t *Table) Freeze() Slots {
	return Slots{Dim: t.cfg.Dim, StateLen: t.cfg.Rule.StateLen(t.cfg.Dim),
		rows: t.rows.freeze(), lastSeen: t.lastSeen.freeze(), free: slices.Clone(t.free)}
}

// Waiting is a key waiting for admission: its sightings so far and the
// step of the last.
type Waiting struct {
	Key  uint64
	N    int32
	Last int64
}

// Waiting is the keys waiting for admission, keys increasing.
func (t *Table) Waiting() []Waiting {
	out := make([]Waiting, 0, len(t.seen))
	for k, s := range t.seen {
		out = append(out, Waiting{Key: k, N: s.n, Last: s.last})
	}
	slices.SortFunc(out, func(a, b Waiting) int { return cmp.Compare(a.Key, b.Key) })
	return out
}

// SetWaiting replaces the keys waiting for admission (a hot standby
// taking its primary's table).
func (t *Table) SetWaiting(w []Waiting) {
	clear(t.seen)
	for _, x := range w {
		t.seen[x.Key] = sightings{n: x.N, last: x.Last}
	}
}

// SetStats sets the table's counters (Rows aside: it is what the table
// holds) to s's: a hot standby taking its primary's table.
func (t *Table) SetStats(s TableStats) {
	s.Rows = 0
	t.stats = s
}
