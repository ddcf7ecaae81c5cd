package ps

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/keysort"
	"github.com/pstrain/pstrain/ml/embed"
)

// Errors of row requests. The gRPC layer maps them to status codes.
var (
	// ErrNotMine refuses a key whose row another shard holds
	// (embed.ShardOf): a client that split its keys with another shard
	// count, or a bug.
	ErrNotMine = errors.New("key belongs to another shard")
	// ErrNoTable refuses a request for a table the run did not declare.
	ErrNoTable = errors.New("no such table")
)

// TableSet is a shard's embedding tables: for each table the run
// declares, an embed.Table holding the rows whose embed.ShardOf is this
// shard. Like Shard it is a plain state machine, with no lock or
// goroutine; the Server serialises calls into it under a lock of its own
// (not the dense model's).
//
// Its version follows the dense shard's (Advance). In sync mode a push of
// a step's row gradients is staged, per worker, and a step's staged rows
// are applied when the dense step completes: the gradients of the
// workers whose dense gradient counted are summed per key and divided by
// their number, the dense step's mean, so a sync step equals one step of
// the whole batch in one process. A worker pushing a key again in the
// same step replaces its gradient (a retried request counts once). In
// async and ssp mode a push is applied on arrival.
//
// A pull is a sighting (admission and eviction, embed.Table). In sync
// mode a key pulled by several workers in one step is sighted once, as
// the whole batch's deduplicated keys are in one process. Eviction runs
// at step boundaries (EvictDue).
type TableSet struct {
	mode      config.Mode
	shard     int
	numShards int
	version   int64
	tables    map[string]*tableState
	names     []string // sorted
	// onlyCreate: no table admits after sightings or evicts, so a pull
	// changes the tables only by creating rows (PullsOnlyCreate).
	onlyCreate bool
}

// tableState is one table of a TableSet, and its sync step under way.
type tableState struct {
	t *embed.Table
	// sighted holds the keys pulled in the sync step under way (only
	// when admission counts sightings).
	sighted map[uint64]struct{}
	// staged holds each worker's row gradients of the sync step.
	staged map[int]*stagedRows
	// spare holds stagedRows of earlier steps, emptied, and sum the
	// step's mean gradients (applyStep): reused from step to step, so a
	// step allocates no maps or arrays once the tables' traffic is
	// steady.
	spare []*stagedRows
	sum   stagedRows
	// pulled holds, by worker, the slots its pulls of the sync step
	// found, in the order of their keys (-1: no row): a worker pushes
	// the gradients of the keys it pulled in the same order, so the
	// step's end finds their rows without the index
	// (embed.Table.PushHinted). hintsAt is the table's Drops as the step
	// began: the slots are good while it stays.
	pulled  map[int][]int32
	hintsAt uint64
}

// stagedRows is one worker's row gradients of one table in a sync step.
type stagedRows struct {
	slot  map[uint64]int
	keys  []uint64
	grads []float32
	hints []int32 // each key's slot as its pull found it (-1: not known)
	used  int     // keys of the worker's pushes in the step: the next push's first hint
}

// reset empties r, keeping its map and arrays.
func (r *stagedRows) reset() {
	clear(r.slot)
	r.keys, r.grads, r.hints, r.used = r.keys[:0], r.grads[:0], r.hints[:0], 0
}

// unstage empties the step's staged rows into spare, and forgets its
// pulls' slots.
func (st *tableState) unstage() {
	for w, r := range st.staged {
		r.reset()
		st.spare = append(st.spare, r)
		delete(st.staged, w)
	}
	for w, p := range st.pulled {
		st.pulled[w] = p[:0]
	}
}

// newTableState is t's state with no step under way; sighted is the
// step's sightings (nil: t admits keys at once).
func newTableState(t *embed.Table, sighted map[uint64]struct{}) *tableState {
	return &tableState{t: t, sighted: sighted, staged: map[int]*stagedRows{}, pulled: map[int][]int32{}, hintsAt: t.Drops()}
}

// hintsFor is room for n more of worker's pull slots in the sync step,
// each -1 (no hint) until the pull writes it.
func (st *tableState) hintsFor(worker, n int) []int32 {
	p := st.pulled[worker]
	p = slices.Grow(p, n)[:len(p)+n]
	st.pulled[worker] = p
	room := p[len(p)-n:]
	for i := range room {
		room[i] = -1
	}
	return room
}

// NewTableSet returns shard's (of numShards) empty tables at version.
func NewTableSet(cfgs []embed.TableConfig, mode config.Mode, shard, numShards int, version int64) (*TableSet, error) {
	if numShards < 1 || shard < 0 || shard >= numShards {
		return nil, fmt.Errorf("ps: tables of shard %d of %d", shard, numShards)
	}
	ts := &TableSet{mode: mode, shard: shard, numShards: numShards, version: version, tables: make(map[string]*tableState, len(cfgs)),
		onlyCreate: true}
	for _, c := range cfgs {
		if _, dup := ts.tables[c.Name]; dup {
			return nil, fmt.Errorf("ps: table %s declared twice", c.Name)
		}
		if err := shardckpt.CheckTableName(c.Name); err != nil {
			return nil, err
		}
		t, err := embed.NewTable(c)
		if err != nil {
			return nil, err
		}
		var sighted map[uint64]struct{}
		if c.AdmitAfter > 1 {
			sighted = map[uint64]struct{}{}
		}
		ts.onlyCreate = ts.onlyCreate && c.AdmitAfter <= 1 && c.EvictAfter <= 0
		ts.tables[c.Name] = newTableState(t, sighted)
		ts.names = append(ts.names, c.Name)
	}
	slices.Sort(ts.names)
	return ts, nil
}

// PullsOnlyCreate says a pull changes the tables only by creating rows
// (no table counts sightings for admission or eviction; the slots a sync
// pull keeps for its push are hints, which may differ): a pull that
// leaves Writes as it was changed nothing.
func (ts *TableSet) PullsOnlyCreate() bool { return ts.onlyCreate }

// Version is the dense shard's version the tables are at.
func (ts *TableSet) Version() int64 { return ts.version }

// Names are the tables' names, sorted.
func (ts *TableSet) Names() []string { return ts.names }

// Table returns a table by name (nil: none).
func (ts *TableSet) Table(name string) *embed.Table {
	if st, ok := ts.tables[name]; ok {
		return st.t
	}
	return nil
}

// lookup returns a table's state, or ErrNoTable.
func (ts *TableSet) lookup(name string) (*tableState, error) {
	st, ok := ts.tables[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q (this shard holds %q)", ErrNoTable, name, ts.names)
	}
	return st, nil
}

// CheckKeys refuses keys whose rows another shard holds.
func (ts *TableSet) CheckKeys(table string, keys []uint64) error {
	if ts.numShards == 1 {
		return nil
	}
	p := embed.PlacerOf(table, ts.numShards) // the table's name hashed once, not per key
	for _, k := range keys {
		if s := p.Shard(k); s != ts.shard {
			return fmt.Errorf("%w: table %s key %d is shard %d's of %d, not shard %d's", ErrNotMine, table, k, s, ts.numShards, ts.shard)
		}
	}
	return nil
}

// checkRequest checks a request's table, keys and values (len(vals)
// must be len(keys) rows).
func (ts *TableSet) checkRequest(table string, keys []uint64, vals []float32) (*tableState, error) {
	st, err := ts.lookup(table)
	if err != nil {
		return nil, err
	}
	if d := st.t.Config().Dim; len(vals) != len(keys)*d {
		return nil, fmt.Errorf("%w: table %s: %d values for %d rows of dimension %d", ErrBadLength, table, len(vals), len(keys), d)
	}
	return st, ts.CheckKeys(table, keys)
}

// Pull writes the rows of keys (unique) into out, creating those of
// admitted keys seen for the first time. A refused pull changes nothing.
func (ts *TableSet) Pull(table string, keys []uint64, out []float32) error {
	return ts.pullAs(-1, table, keys, out)
}

// pullAs is Pull by worker (-1: none named); a sync worker's pull keeps
// the slots it found for the step's end (tableState.pulled).
func (ts *TableSet) pullAs(worker int, table string, keys []uint64, out []float32) error {
	st, err := ts.checkRequest(table, keys, out)
	if err != nil {
		return err
	}
	var hints []int32
	if worker >= 0 && ts.mode == config.Sync {
		hints = st.hintsFor(worker, len(keys))
	}
	if st.sighted == nil || ts.mode != config.Sync {
		return st.t.PullSlots(ts.version, keys, out, hints)
	}
	// Sync with admission: a key already sighted this step (by another
	// worker) is not sighted again.
	d := st.t.Config().Dim
	for i, k := range keys {
		dst := out[i*d : (i+1)*d]
		if hints != nil {
			hints[i] = -1
		}
		if _, again := st.sighted[k]; again {
			if row, _, ok := st.t.Row(k); ok {
				copy(dst, row)
			} else {
				embed.InitRow(st.t.Config().Seed, table, k, dst)
			}
			continue
		}
		st.sighted[k] = struct{}{}
		var slot []int32
		if hints != nil {
			slot = hints[i : i+1]
		}
		if err := st.t.PullSlots(ts.version, keys[i:i+1], dst, slot); err != nil {
			return err
		}
	}
	return nil
}

// RowBlock is one table's keys (unique) and a row of values for each: a
// pull's rows, a push's gradients.
type RowBlock struct {
	Table  string
	Keys   []uint64
	Values []float32
}

// PullBlocks is Pull of several tables' rows by worker, or for a reader
// that is no worker (worker < 0: the chief's evaluations) Peek; a
// refused block (checked before any is pulled) refuses them all.
func (ts *TableSet) PullBlocks(worker int, blocks []RowBlock) error {
	for _, b := range blocks {
		if _, err := ts.checkRequest(b.Table, b.Keys, b.Values); err != nil {
			return err
		}
	}
	for _, b := range blocks {
		var err error
		if worker < 0 {
			err = ts.Peek(b.Table, b.Keys, b.Values)
		} else {
			err = ts.pullAs(worker, b.Table, b.Keys, b.Values)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Peek reads the rows of keys into out without sighting them: a key
// without a row reads its initial value, and nothing changes (the
// chief's evaluation reads the model, it does not train it).
func (ts *TableSet) Peek(table string, keys []uint64, out []float32) error {
	st, err := ts.checkRequest(table, keys, out)
	if err != nil {
		return err
	}
	return st.t.Peek(keys, out)
}

// Push delivers worker's gradients of keys' rows (unique keys, one row
// of grads each), computed from the rows at version. Sync: a gradient
// of an older version is Stale and dropped, one of the current version
// staged for the step's end. Async and ssp: applied now (Applied). A
// refused push changes nothing.
func (ts *TableSet) Push(worker int, version int64, table string, keys []uint64, grads []float32) (Outcome, error) {
	return ts.PushBlocks(worker, version, []RowBlock{{Table: table, Keys: keys, Values: grads}})
}

// PushBlocks is Push of several tables' gradients; a refused block
// (checked before any is applied) refuses them all.
func (ts *TableSet) PushBlocks(worker int, version int64, blocks []RowBlock) (Outcome, error) {
	if worker < 0 {
		return Applied, fmt.Errorf("%w: %d", ErrBadWorker, worker)
	}
	if version > ts.version {
		return Applied, fmt.Errorf("%w: row gradients from version %d, tables at %d", ErrFutureVersion, version, ts.version)
	}
	states := make([]*tableState, len(blocks))
	for i, b := range blocks {
		st, err := ts.checkRequest(b.Table, b.Keys, b.Values)
		if err != nil {
			return Applied, err
		}
		if !isFinite(sumSquares(b.Values)) {
			return Applied, fmt.Errorf("%w: table %s", ErrNonFinite, b.Table)
		}
		states[i] = st
	}
	if ts.mode == config.Sync && version < ts.version {
		return Stale, nil
	}
	for i, b := range blocks {
		st := states[i]
		if ts.mode == config.Sync {
			st.stage(worker, b.Keys, b.Values, st.t.Config().Dim)
			continue
		}
		if err := st.t.Push(ts.version, b.Keys, b.Values); err != nil {
			return Applied, err
		}
	}
	return Applied, nil
}

// stage keeps worker's gradients for the sync step's end; a key it
// pushed before in the step has its gradient replaced. The worker's
// pulls' slots, in order, are its pushes' keys' hints.
func (st *tableState) stage(worker int, keys []uint64, grads []float32, d int) {
	w := st.staged[worker]
	if w == nil {
		if n := len(st.spare); n > 0 {
			w, st.spare = st.spare[n-1], st.spare[:n-1]
		} else {
			w = &stagedRows{slot: make(map[uint64]int, len(keys))}
		}
		st.staged[worker] = w
	}
	pulled := st.pulled[worker]
	for i, k := range keys {
		src := grads[i*d : (i+1)*d]
		if s, ok := w.slot[k]; ok {
			copy(w.grads[s*d:(s+1)*d], src)
			continue
		}
		hint := int32(-1)
		if j := w.used + i; j < len(pulled) {
			hint = pulled[j]
		}
		w.slot[k] = len(w.keys)
		w.keys = append(w.keys, k)
		w.grads = append(w.grads, src...)
		w.hints = append(w.hints, hint)
	}
	w.used += len(keys)
}

// Advance moves the tables to the dense shard's version. Sync: when the
// version moves on by one step, the step's gradients of the workers in
// accepted (those whose dense gradient the step counted) are summed per
// key, divided by their number and applied; the others are dropped.
// Eviction runs when a step boundary passed is due (EvictDue). Advance to
// the version the tables are at does nothing.
func (ts *TableSet) Advance(version int64, accepted []int) error {
	if version == ts.version {
		return nil
	}
	from := ts.version
	var err error
	for _, name := range ts.names {
		st := ts.tables[name]
		if ts.mode == config.Sync && version == from+1 && len(accepted) > 0 {
			err = errors.Join(err, st.applyStep(from, accepted))
		}
		st.unstage()
		clear(st.sighted)
		if evictAfter := st.t.Config().EvictAfter; evictDueIn(from, version, evictAfter) {
			st.t.Evict(version)
		}
		st.hintsAt = st.t.Drops() // (the next step's)
	}
	ts.version = version
	return err
}

// applyStep applies the mean of the accepted workers' staged gradients
// of the step at version (workers summed in increasing index order, so
// every replica of the state sums alike).
func (st *tableState) applyStep(version int64, accepted []int) error {
	d := st.t.Config().Dim
	ws := slices.Sorted(slices.Values(accepted))
	sum := &st.sum
	if sum.slot == nil {
		sum.slot = map[uint64]int{}
	}
	sum.reset()
	most := 0 // keys the sum can hold: every worker's
	for _, w := range ws {
		if g := st.staged[w]; g != nil {
			most += len(g.keys)
		}
	}
	sum.keys, sum.grads = slices.Grow(sum.keys, most), slices.Grow(sum.grads, most*d)
	for _, w := range ws {
		g := st.staged[w]
		if g == nil {
			continue
		}
		for i, k := range g.keys {
			s, ok := sum.slot[k]
			if !ok {
				s = len(sum.keys)
				sum.slot[k] = s
				sum.keys = append(sum.keys, k)
				sum.grads = append(sum.grads, make([]float32, d)...)
				sum.hints = append(sum.hints, g.hints[i])
			} else if sum.hints[s] < 0 {
				// (a worker's pull before found no row: with admission,
				// another's sighting may have created it since)
				sum.hints[s] = g.hints[i]
			}
			dst, src := sum.grads[s*d:(s+1)*d], g.grads[i*d:(i+1)*d]
			for j := range dst {
				dst[j] += src[j]
			}
		}
	}
	if len(sum.keys) == 0 {
		return nil
	}
	inv := 1 / float32(len(ws))
	for i := range sum.grads {
		sum.grads[i] *= inv
	}
	return st.t.PushHinted(version, sum.keys, sum.hints, st.hintsAt, sum.grads)
}

// EvictDue says whether eviction runs at the step boundary reaching
// version, for a table evicting rows unseen for more than evictAfter
// steps: at every multiple of max(1, evictAfter/8). Scanning a table
// costs its rows, so it does not run at every step; a row unseen for
// more than evictAfter steps is dropped within evictAfter/8 more.
func EvictDue(version, evictAfter int64) bool {
	if evictAfter <= 0 {
		return false
	}
	return version%max(1, evictAfter/8) == 0
}

// evictDueIn says whether a boundary in (from, to] is due (EvictDue).
func evictDueIn(from, to, evictAfter int64) bool {
	if evictAfter <= 0 || to <= from {
		return false
	}
	every := max(1, evictAfter/8)
	return to/every > from/every
}

// TableStats returns each table's counters, by name.
func (ts *TableSet) TableStats() map[string]embed.TableStats {
	out := make(map[string]embed.TableStats, len(ts.tables))
	for n, st := range ts.tables {
		out[n] = st.t.Stats()
	}
	return out
}

// Bytes is what each table's rows and optimizer state take, by name.
func (ts *TableSet) Bytes() map[string]int64 {
	out := make(map[string]int64, len(ts.tables))
	for n, st := range ts.tables {
		out[n] = st.t.Bytes()
	}
	return out
}

// Snapshot copies every table's rows, keys sorted (checkpoints).
func (ts *TableSet) Snapshot() []shardckpt.TableRows {
	return slotRows(ts.FreezeSlots(nil))
}

// TableSlots is a table's slots as frozen by FreezeSlots: every slot's
// key, row and state, freed ones included.
type TableSlots struct {
	Name  string
	Kind  embed.Kind
	Slots embed.Slots
}

// FreezeSlots freezes every table's slots (embed.Table.Freeze: views
// sharing the tables' blocks, which the tables copy before writing into
// them), appended to reuse[:0]: fast enough to hold the locks for; Rows
// sorts them out afterwards.
func (ts *TableSet) FreezeSlots(reuse []TableSlots) []TableSlots {
	out := reuse[:0]
	for _, name := range ts.names {
		t := ts.tables[name].t
		out = append(out, TableSlots{Name: name, Kind: t.Config().Rule.Kind, Slots: t.Freeze()})
	}
	return out
}

// Rows is the table's live rows, keys sorted (a copy).
func (s TableSlots) Rows() shardckpt.TableRows {
	src := s.Source()
	d, sl := src.Dim, src.StateLen
	r := shardckpt.TableRows{Name: s.Name, Kind: s.Kind, Dim: d, StateLen: sl, Keys: src.Keys,
		Values: make([]float32, 0, len(src.Keys)*d), State: make([]float32, 0, len(src.Keys)*sl)}
	for i := range src.Keys {
		r.Values = append(r.Values, src.Row(i)...)
		r.State = append(r.State, src.State(i)...)
	}
	return r
}

// Source is the table's live rows in key order, read from the frozen
// slots as a checkpoint is written (shardckpt.SourceTensors): only the
// keys and their slots are copied.
func (s TableSlots) Source() shardckpt.RowSource {
	v := s.Slots
	freed := make([]bool, v.Len())
	for _, f := range v.Free() {
		freed[f] = true
	}
	live := v.Len() - len(v.Free())
	keys, at := make([]uint64, 0, live), make([]int32, 0, live)
	for i := range v.Len() {
		if !freed[i] {
			keys, at = append(keys, v.Key(i)), append(at, int32(i))
		}
	}
	keysort.Pairs(keys, at)
	return shardckpt.RowSource{Name: s.Name, Kind: s.Kind, Dim: v.Dim, StateLen: v.StateLen, Keys: keys,
		Row: func(i int) []float32 { return v.Row(int(at[i])) }, State: func(i int) []float32 { return v.State(int(at[i])) }}
}

// slotSources is Source of every table.
func slotSources(slots []TableSlots) []shardckpt.RowSource {
	out := make([]shardckpt.RowSource, len(slots))
	for i, s := range slots {
		out[i] = s.Source()
	}
	return out
}

// slotRows is Rows of every table.
func slotRows(slots []TableSlots) []shardckpt.TableRows {
	out := make([]shardckpt.TableRows, len(slots))
	for i, s := range slots {
		out[i] = s.Rows()
	}
	return out
}

// Load adds restored rows to their table (a checkpoint's, or rows moved
// from another shard); each must be this shard's, and one the table
// does not hold (embed.Table.Load). A refused load changes nothing.
func (ts *TableSet) Load(r shardckpt.TableRows) error {
	st, err := ts.lookup(r.Name)
	if err != nil {
		return err
	}
	cfg := st.t.Config()
	if err := r.Check(cfg.Dim, cfg.Rule.StateLen(cfg.Dim)); err != nil {
		return err
	}
	if err := ts.CheckKeys(r.Name, r.Keys); err != nil {
		return err
	}
	return st.t.Load(ts.version, r.Keys, r.Values, r.State)
}

// prefillChunk is how many of a table's pre-filled keys Prefill hands
// the table at a time.
const prefillChunk = 4096

// Prefill creates, in table name, this shard's rows among the table's
// first n pre-filled keys (embed.PrefillKey(0) to PrefillKey(n-1), each
// on its embed.ShardOf shard), as a first touch creates a row, and
// returns how many it created. The shards of a run, each pre-filled
// with the same n, hold n rows between them that no data key touches.
func (ts *TableSet) Prefill(ctx context.Context, name string, n int64) (int, error) {
	st, err := ts.lookup(name)
	if err != nil {
		return 0, err
	}
	if n < 0 || n > embed.MaxPrefill {
		return 0, fmt.Errorf("ps: table %s: %d rows to pre-fill, want 0 to %d", name, n, embed.MaxPrefill)
	}
	place := embed.PlacerOf(name, ts.numShards)
	chunk := make([]uint64, 0, prefillChunk)
	made := 0
	for i := range n {
		k := embed.PrefillKey(i)
		if place.Shard(k) != ts.shard {
			continue
		}
		if chunk = append(chunk, k); len(chunk) == cap(chunk) {
			if err := ctx.Err(); err != nil {
				return made, fmt.Errorf("ps: pre-filling table %s: %w", name, err)
			}
			made += st.t.Fill(chunk, ts.version)
			chunk = chunk[:0]
		}
	}
	return made + st.t.Fill(chunk, ts.version), nil
}

// Writes sums the tables' Writes: equal sums, the set's rows are
// unchanged.
func (ts *TableSet) Writes() uint64 {
	var n uint64
	for _, st := range ts.tables {
		n += st.t.Writes()
	}
	return n
}

// Keep is ts's tables as the set like is (its shard, number of shards,
// version and mode): each table keeps the rows whose keys that layout
// places on like's shard (embed.ShardOf) and drops the others, and no
// step is under way. It refuses (nil) unless like is of ts's shard and
// its tables have ts's tables' configurations, each. ts is not to be
// used after a set is returned: the two share the tables.
func (ts *TableSet) Keep(like *TableSet) *TableSet {
	if len(like.tables) != len(ts.tables) || like.shard != ts.shard {
		return nil
	}
	for name, l := range like.tables {
		if st, ok := ts.tables[name]; !ok || st.t.Config() != l.t.Config() {
			return nil
		}
	}
	out := &TableSet{mode: like.mode, shard: like.shard, numShards: like.numShards, version: like.version,
		tables: make(map[string]*tableState, len(ts.tables)), names: like.names, onlyCreate: like.onlyCreate}
	// One shard, or the same count (and shard), places every key here:
	// nothing to drop.
	all := like.numShards == 1 || like.numShards == ts.numShards
	for name, st := range ts.tables {
		if place := embed.PlacerOf(name, like.numShards); !all {
			st.t.Retain(func(k uint64) bool { return place.Shard(k) == like.shard })
		}
		out.tables[name] = newTableState(st.t, like.tables[name].sighted)
	}
	return out
}
