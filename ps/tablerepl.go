package ps

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/ml/embed"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// Hot standbys of a shard with embedding tables (docs/replication.md,
// "Embedding tables"). A worker's row pull (it creates rows and counts
// sightings) and row push change the tables, and a sync step's end
// applies the rows staged in it when the dense shard's version moves.
// So a standby's tables equal its primary's only if it applies the row
// requests in the order the primary applied them relative to the dense
// pushes. A primary with a standby therefore applies a worker's row
// request under the Server's lock as well as the tables', and queues it
// on the one replication stream: the standby applies every operation,
// dense or rows, in the primary's order with the same code, and its
// tables move on to the next step when its dense shard does, as the
// primary's do. Without a standby row requests take the tables' lock
// alone.

// lockRows takes the tables' lock for a row request, and the Server's
// before it when the request is to be replicated (a worker's, whose
// primary has a standby: sighting is false for the chief's reads, which
// change nothing); both says which.
func (s *Server) lockRows(sighting bool) (both bool) {
	h := s.tables
	h.mu.Lock()
	if !sighting || !h.replicating {
		return false
	}
	h.mu.Unlock()
	s.mu.Lock()
	h.mu.Lock()
	return true
}

// unlockRows releases what lockRows took.
func (s *Server) unlockRows(both bool) {
	s.tables.mu.Unlock()
	if both {
		s.mu.Unlock()
	}
}

// setReplicating records whether the shard's row requests are
// replicated. Call with the Server's lock held.
func (h *tableHost) setReplicating(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.replicating = on
}

// setRole records why workers' row requests are refused (nil: they are
// served) and whether the process is a standby. Call with the Server's
// lock held.
func (h *tableHost) setRole(refuse error, standby bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.refuse, h.mirror = refuse, standby
}

// clonePullRows copies a row pull for the standby's queue: a data
// plane's request lives in its connection's buffers.
func clonePullRows(req *pb.PullRowsRequest) *pb.PullRowsRequest {
	return &pb.PullRowsRequest{RunId: req.RunId, Worker: req.Worker, Generation: req.Generation, MinVersion: req.MinVersion,
		Tables: cloneBlocks(req.Tables)}
}

// clonePushRows copies a row push for the standby's queue.
func clonePushRows(req *pb.PushRowsRequest) *pb.PushRowsRequest {
	return &pb.PushRowsRequest{RunId: req.RunId, Worker: req.Worker, Generation: req.Generation, Version: req.Version,
		Tables: cloneBlocks(req.Tables)}
}

func cloneBlocks(in []*pb.RowBlock) []*pb.RowBlock {
	out := make([]*pb.RowBlock, len(in))
	for i, b := range in {
		out[i] = &pb.RowBlock{Table: strings.Clone(b.Table), Keys: slices.Clone(b.Keys), SmallKeys: slices.Clone(b.SmallKeys),
			Values: slices.Clone(b.Values)}
	}
	return out
}

// snapshotRowsChunk is how many rows one rows operation of a snapshot
// carries: about half a MiB of rows of dimension 16 with Adagrad's state.
const snapshotRowsChunk = 4096

// tablesSnapshot is the tables' part of a snapshot: their state, and
// their rows as operations to follow it, each written by its fill when
// the link sends it (nil: no tables). The rows are read from the
// tables' slots frozen now (embed.Table.Freeze: the tables copy a block
// before writing into it while the view holds it), so the shard's locks
// are held only to freeze them, whatever the tables' size. From then on
// workers' row requests are replicated. Call with the Server's lock
// held.
func (h *tableHost) tablesSnapshot() (*pb.TablesState, []*pb.ReplicaOp, map[*pb.ReplicaOp]chunkFill) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set == nil {
		return nil, nil, nil
	}
	h.replicating = true
	state := h.set.stateProto()
	var ops []*pb.ReplicaOp
	fills := map[*pb.ReplicaOp]chunkFill{}
	for _, ts := range h.set.FreezeSlots(nil) {
		cfg := h.set.Table(ts.Name).Config()
		feed := newRowFeed(ts, cfg.EvictAfter > 0)
		row := int(embed.RowBytes(cfg))
		for left := feed.live; left > 0; left -= snapshotRowsChunk {
			n := min(left, snapshotRowsChunk)
			op := &pb.ReplicaOp{Op: &pb.ReplicaOp_Rows{Rows: &pb.TableRowsChunk{Table: ts.Name}}}
			ops = append(ops, op)
			fills[op] = chunkFill{feed: feed, chunk: op.GetRows(), rows: n, bytes: n * row}
		}
	}
	state.Chunks = int64(len(ops))
	return state, ops, fills
}

// chunkFill writes a snapshot's rows operation: the next rows of its
// table's frozen slots.
type chunkFill struct {
	feed  *rowFeed
	chunk *pb.TableRowsChunk
	rows  int // how many
	bytes int // about what they take
}

// write fills the operation's chunk. The link writes a snapshot's rows
// operations once each, in order.
func (f chunkFill) write() { f.feed.next(f.chunk, f.rows) }

// rowFeed reads a table's frozen slots, the live ones in slot order, into
// rows operations.
type rowFeed struct {
	slots  TableSlots
	evicts bool   // the table evicts: its rows' last sightings go too
	free   []bool // by slot (made by the first next, on the link's goroutine)
	live   int    // slots holding a row
	at     int    // the next slot to read
}

func newRowFeed(ts TableSlots, evicts bool) *rowFeed {
	return &rowFeed{slots: ts, evicts: evicts, live: ts.Slots.Len() - len(ts.Slots.Free())}
}

// next writes the next n live rows into c: keys, values, state and, for
// a table that evicts, each row's last sighting.
func (f *rowFeed) next(c *pb.TableRowsChunk, n int) {
	v := f.slots.Slots
	if f.free == nil {
		f.free = make([]bool, v.Len())
		for _, s := range v.Free() {
			f.free[s] = true
		}
	}
	d, sl := v.Dim, v.StateLen
	evicts := f.evicts
	keys := make([]uint64, 0, n)
	vals, state := make([]float32, 0, n*d), make([]float32, 0, n*sl)
	var seen []int64
	for ; len(keys) < n && f.at < v.Len(); f.at++ {
		if f.free[f.at] {
			continue
		}
		keys = append(keys, v.Key(f.at))
		vals, state = append(vals, v.Row(f.at)...), append(state, v.State(f.at)...)
		if evicts {
			seen = append(seen, v.LastSeen(f.at))
		}
	}
	c.Keys, c.Values, c.State, c.LastSeen = keys, wire.Bytes(vals), wire.Bytes(state), seen
}

// snapshotRowsLeft is the rows operations of its snapshot a standby has
// yet to apply.
func (h *tableHost) snapshotRowsLeft() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.chunksLeft
}

// loadingRows says whether the tables wait for a checkpoint's rows: a
// snapshot waits for them (Server.rowsLoaded).
func (h *tableHost) loadingRows() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.loading
}

// rowsLoaded attaches the standby whose snapshot waited for the tables'
// rows to be loaded (startReplica), if any.
func (s *Server) rowsLoaded() {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rep
	if r == nil || !r.pending || s.tables.loadingRows() {
		return
	}
	r.pending = false
	s.queueSnapshot(r)
	s.log.Info("the tables' rows are loaded: attaching the hot standby", "addr", r.addr, "epoch", r.epoch)
}

// stateProto is the set's state as a snapshot carries it, its rows
// aside (rowOps).
func (ts *TableSet) stateProto() *pb.TablesState {
	out := &pb.TablesState{Version: ts.version}
	for _, name := range ts.names {
		st := ts.tables[name]
		stats := st.t.Stats()
		tp := &pb.TableStateProto{Name: name, Sighted: slices.Sorted(maps.Keys(st.sighted)),
			Admissions: stats.Admissions, Evictions: stats.Evictions, Dropped: stats.Dropped}
		for _, w := range slices.Sorted(maps.Keys(st.staged)) {
			g := st.staged[w]
			tp.Staged = append(tp.Staged, &pb.StagedRowsProto{Worker: int32(w), Keys: slices.Clone(g.keys),
				Grads: slices.Clone(wire.Bytes(g.grads))})
		}
		for _, x := range st.t.Waiting() {
			tp.WaitingKeys = append(tp.WaitingKeys, x.Key)
			tp.WaitingCount = append(tp.WaitingCount, x.N)
			tp.WaitingLast = append(tp.WaitingLast, x.Last)
		}
		out.Tables = append(out.Tables, tp)
	}
	return out
}

// restoreState makes the set's state p's (a standby installing its
// primary's snapshot, before the rows that follow it): its version, each
// table's sync step under way, the keys waiting for admission and the
// counters.
func (ts *TableSet) restoreState(p *pb.TablesState) error {
	if len(p.Tables) != len(ts.tables) {
		return fmt.Errorf("a snapshot of %d tables for a shard of %d", len(p.Tables), len(ts.tables))
	}
	ts.version = p.Version
	for _, tp := range p.Tables {
		st, err := ts.lookup(tp.Name)
		if err != nil {
			return err
		}
		if len(tp.WaitingCount) != len(tp.WaitingKeys) || len(tp.WaitingLast) != len(tp.WaitingKeys) {
			return fmt.Errorf("table %s: %d keys waiting for admission with %d counts and %d steps", tp.Name, len(tp.WaitingKeys), len(tp.WaitingCount), len(tp.WaitingLast))
		}
		st.unstage()
		if len(tp.Sighted) > 0 && st.sighted == nil {
			return fmt.Errorf("table %s: sightings of a step for a table that admits keys at once", tp.Name)
		}
		clear(st.sighted)
		for _, k := range tp.Sighted {
			st.sighted[k] = struct{}{}
		}
		d := st.t.Config().Dim
		for _, g := range tp.Staged {
			grads, err := wire.Floats(g.Grads)
			if err != nil || len(grads) != len(g.Keys)*d || g.Worker < 0 {
				return fmt.Errorf("table %s: worker %d's staged rows: %d values for %d keys of dimension %d", tp.Name, g.Worker, len(g.Grads)/4, len(g.Keys), d)
			}
			st.stage(int(g.Worker), g.Keys, grads, d)
		}
		waiting := make([]embed.Waiting, len(tp.WaitingKeys))
		for i, k := range tp.WaitingKeys {
			waiting[i] = embed.Waiting{Key: k, N: tp.WaitingCount[i], Last: tp.WaitingLast[i]}
		}
		st.t.SetWaiting(waiting)
		st.t.SetStats(embed.TableStats{Admissions: tp.Admissions, Evictions: tp.Evictions, Dropped: tp.Dropped})
		st.hintsAt = st.t.Drops()
	}
	return nil
}

// loadChunk puts a snapshot's rows into their table, each with its
// last sighting (none: the set's version).
func (ts *TableSet) loadChunk(c *pb.TableRowsChunk) error {
	st, err := ts.lookup(c.Table)
	if err != nil {
		return err
	}
	cfg := st.t.Config()
	d, sl := cfg.Dim, cfg.Rule.StateLen(cfg.Dim)
	vals, err := wire.Floats(c.Values)
	if err != nil {
		return err
	}
	state, err := wire.Floats(c.State)
	if err != nil {
		return err
	}
	if len(vals) != len(c.Keys)*d || len(state) != len(c.Keys)*sl || (len(c.LastSeen) > 0 && len(c.LastSeen) != len(c.Keys)) {
		return fmt.Errorf("table %s: a chunk of %d rows with %d values, %d state values and %d sightings", c.Table, len(c.Keys), len(vals), len(state), len(c.LastSeen))
	}
	st.t.Reserve(st.t.Len() + len(c.Keys))
	for i, k := range c.Keys {
		seen := ts.version
		if len(c.LastSeen) > 0 {
			seen = c.LastSeen[i]
		}
		if err := st.t.Put(k, seen, vals[i*d:(i+1)*d], state[i*sl:(i+1)*sl]); err != nil {
			return err
		}
	}
	return nil
}

// restoreTablesState makes ts's state p's (nil: a snapshot of a shard
// without tables, for ts nil): a standby building its primary's shard.
func restoreTablesState(ts *TableSet, p *pb.TablesState) error {
	if (p == nil) != (ts == nil) {
		return status.Errorf(codes.InvalidArgument, "replica snapshot: tables in the snapshot %t, declared by its init %t", p != nil, ts != nil)
	}
	if p == nil {
		return nil
	}
	if err := ts.restoreState(p); err != nil {
		return status.Errorf(codes.InvalidArgument, "replica snapshot: %v", err)
	}
	return nil
}

// awaitChunks readies the tables a standby installed from a snapshot (p:
// their state; nil, none) for the snapshot's rows: they are loading
// until the last of its rows operations is applied. Call with the
// Server's lock held.
func (h *tableHost) awaitChunks(p *pb.TablesState, sh *Shard) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set == nil {
		return
	}
	h.chunksLeft = p.GetChunks()
	h.loading, h.done = h.chunksLeft > 0, sh.Done()
	h.exportAll()
}

// applyTableOp applies one of the primary's row operations on a
// standby. Call with the Server's lock held.
func (s *Server) applyTableOp(op *pb.ReplicaOp) error {
	h := s.tables
	h.mu.Lock()
	defer h.mu.Unlock()
	var runID string
	switch {
	case op.GetPullRows() != nil:
		runID = op.GetPullRows().RunId
	case op.GetPushRows() != nil:
		runID = op.GetPushRows().RunId
	default:
		runID = h.runID
	}
	if err := h.check(runID); err != nil {
		return err
	}
	var err error
	switch {
	case op.GetPullRows() != nil:
		// (The answer is the primary's to give: only the pull's sightings
		// and rows created matter here.)
		_, _, err = h.pull(op.GetPullRows(), h.scratchRows, false)
	case op.GetPushRows() != nil:
		_, err = h.push(op.GetPushRows(), nil)
	case op.GetRows() != nil:
		if h.chunksLeft <= 0 {
			err = fmt.Errorf("rows of table %s after the snapshot's last", op.GetRows().Table)
			break
		}
		if err = h.set.loadChunk(op.GetRows()); err == nil {
			h.chunksLeft--
			h.loading = h.chunksLeft > 0
			h.export(op.GetRows().Table)
		}
	}
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "replicated row operation: %v (the primary applied it)", err)
	}
	return nil
}

// scratchRows is room for a replicated pull's n row values, reused.
// Call with mu held.
func (h *tableHost) scratchRows(n int) []float32 {
	if cap(h.scratch) < n {
		h.scratch = make([]float32, n)
	}
	return h.scratch[:n]
}

// snapshotInit is what a snapshot's Init says of the tables: they are
// built empty, as for a load (no rows pre-filled), and the rows follow.
func snapshotInit(init *pb.InitRequest) {
	init.RowsLoading, init.RowsFromCheckpoint, init.KeepRows, init.KeepRowsVersion = len(init.Tables) > 0, nil, false, 0
}
