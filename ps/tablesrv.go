package ps

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// tableHost serves a shard's embedding tables (a TableSet) under a lock
// of its own: without a hot standby, row requests never take the dense
// model's lock. The Server's hooks, called with its lock held, take
// this one inside it (install at Init, advance when the version moves,
// stop, snapshot); a worker's row request to a primary with a standby
// takes the Server's lock before this one (lockRows), so the order is
// always the same.
type tableHost struct {
	m *metrics.Tables

	mu      sync.Mutex
	set     *TableSet // nil: not initialised, or a run without tables
	inited  bool      // an Init was installed
	runID   string
	gen     int64
	done    bool
	nanSkip bool
	loading bool          // a checkpoint's rows are being loaded (the chief's LoadRows, or loadFromCheckpoint): row requests wait
	changed chan struct{} // closed and replaced when a pull may become ready
	// quarantined are the dense shard's quarantined workers, by index:
	// their row pushes are dropped (sync steps leave them out anyway).
	quarantined []bool
	// exported is each table's metrics, looked up once a table (a row
	// request counts and exports every table it names), with its counters
	// already added to them (their deltas are added at each change).
	exported map[string]*tableMetrics
	// snapped is the tables of the last snapshot (install's keep).
	snapped snapMark
	// replicating: the shard is a primary whose standby holds a snapshot
	// of the tables (or has one on its way): a worker's row request then
	// takes the Server's lock too, and is queued for the standby in the
	// order it was applied (tablerepl.go).
	replicating bool
	// refuse, unless nil, refuses workers' row requests: the process is
	// a standby or a deposed primary (Server.serving).
	refuse error
	// scratch is a standby's room for a replicated pull's rows.
	scratch []float32
	// mirror: the process is a standby, whose tables' counters are its
	// primary's to export (a sum over PS processes counts each row
	// once); promoted, it counts from then on.
	mirror bool
	// chunksLeft is the rows operations of its snapshot a standby has yet
	// to apply: its tables are loading until then.
	chunksLeft int64
}

// tableMetrics is one table's metrics (its labels' children of the
// metric vectors) and the counters already added to them.
type tableMetrics struct {
	rows, bytes                    prometheus.Gauge
	admissions, evictions, dropped prometheus.Counter
	pulled, pushed                 prometheus.Counter
	added                          embed.TableStats
}

// metricsOf is table name's metrics, looked up on first use. Call with
// mu held.
func (h *tableHost) metricsOf(name string) *tableMetrics {
	if tm := h.exported[name]; tm != nil {
		return tm
	}
	m := h.m
	tm := &tableMetrics{rows: m.Rows.WithLabelValues(name), bytes: m.Bytes.WithLabelValues(name),
		admissions: m.Admissions.WithLabelValues(name), evictions: m.Evictions.WithLabelValues(name),
		dropped: m.Dropped.WithLabelValues(name),
		pulled:  m.RowRequests.WithLabelValues(name, "pull"), pushed: m.RowRequests.WithLabelValues(name, "push")}
	h.exported[name] = tm
	return tm
}

func newTableHost(m *metrics.Tables) *tableHost {
	if m == nil {
		m = metrics.NewTables(nil)
	}
	return &tableHost{m: m, changed: make(chan struct{}), exported: map[string]*tableMetrics{}}
}

// notify wakes the blocked row pulls. Call with mu held.
func (h *tableHost) notify() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// TableConfigs reads the tables an Init declares.
func TableConfigs(specs []*pb.TableSpec) ([]embed.TableConfig, error) {
	out := make([]embed.TableConfig, 0, len(specs))
	for _, t := range specs {
		c := embed.TableConfig{Name: t.Name, Dim: int(t.Dim), Seed: t.Seed,
			Rule:       embed.Rule{Kind: embed.Kind(t.Rule), LR: t.Lr, Momentum: t.Momentum, InitAcc: t.InitAcc, Eps: t.Eps},
			AdmitAfter: int(t.AdmitAfter), EvictAfter: t.EvictAfter}
		if err := c.Validate(); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// TableSpecs are tables' configurations as InitRequest.tables.
func TableSpecs(cfgs []embed.TableConfig) []*pb.TableSpec {
	out := make([]*pb.TableSpec, len(cfgs))
	for i, c := range cfgs {
		out[i] = &pb.TableSpec{Name: c.Name, Dim: int32(c.Dim), Seed: c.Seed, Rule: string(c.Rule.Kind), Lr: c.Rule.LR,
			Momentum: c.Rule.Momentum, InitAcc: c.Rule.InitAcc, Eps: c.Rule.Eps, AdmitAfter: int32(c.AdmitAfter), EvictAfter: c.EvictAfter}
	}
	return out
}

// buildTables makes the (empty) tables req declares, nil if none; its
// errors are gRPC statuses.
func buildTables(ctx context.Context, req *pb.InitRequest, mode config.Mode) (*TableSet, error) {
	if len(req.Tables) == 0 {
		return nil, nil
	}
	cfgs, err := TableConfigs(req.Tables)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// The chief's factor after a rollback scales the rows' rate as it
	// does the dense layers' (Options.LRFactor): a model that diverged
	// goes on more slowly in all its parameters.
	if f := req.GetShardOptions().GetLrFactor(); f > 0 && f < 1 {
		for i := range cfgs {
			cfgs[i].Rule.LR *= float32(f)
		}
	}
	ts, err := NewTableSet(cfgs, mode, int(req.Shard), max(1, int(req.NumShards)), req.Version)
	if err == nil && !req.RowsLoading {
		err = prefill(ctx, ts, req.Tables)
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return ts, nil
}

// prefill creates the rows of the tables' prefill_rows on ts. An Init
// that loads a checkpoint's rows does not: the checkpoint holds the
// pre-filled rows with the others.
func prefill(ctx context.Context, ts *TableSet, specs []*pb.TableSpec) error {
	for _, t := range specs {
		if t.PrefillRows == 0 {
			continue
		}
		if _, err := ts.Prefill(ctx, t.Name, t.PrefillRows); err != nil {
			return err
		}
	}
	return nil
}

// tensors names a snapshot's dense state and table rows as checkpoint
// tensors, the rows read from the frozen slots as they are written.
func (sn *snapshot) tensors() ([]checkpoint.Tensor, error) {
	tensors, err := shardckpt.Tensors(sn.plan, sn.index, sn.optName, sn.params, sn.opt)
	if err != nil {
		return nil, err
	}
	rows, err := shardckpt.SourceTensors(slotSources(sn.tables))
	return append(tensors, rows...), err
}

// install makes set (nil: none) the shard's tables for run runID at
// generation gen, replacing those before, and says whether it kept the
// rows of those before instead (keep).
//
// With keep, an Init asks the shard to keep the rows its tables held
// when it snapshotted version keepAt, the rows a checkpoint of that
// version holds: the tables before stay, as set's shard and version
// (TableSet.Keep), if they are the snapshot's (the same tables, the same
// run, no row written since), of set's configurations, and the rest is
// loaded (loading: by the chief, or loadFromCheckpoint). Otherwise set is
// installed, empty, for all its rows to be loaded.
func (h *tableHost) install(set *TableSet, runID string, gen int64, nanSkip, loading bool, keep bool, keepAt int64) (kept bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if keep && loading && set != nil && h.set != nil && h.runID == runID && h.snapped.set == h.set &&
		h.snapped.version == keepAt && h.snapped.writes == h.set.Writes() {
		if k := h.set.Keep(set); k != nil {
			set, kept = k, true
		}
	}
	if h.set != nil && !kept {
		for _, name := range h.set.Names() {
			h.m.Rows.DeleteLabelValues(name)
			h.m.Bytes.DeleteLabelValues(name)
		}
	}
	h.set, h.inited, h.runID, h.gen, h.done, h.nanSkip, h.loading = set, true, runID, gen, false, nanSkip, loading && set != nil
	h.snapped = snapMark{}
	if !kept {
		// (Kept tables keep their series: their counters' growth is
		// added from what was already.)
		clear(h.exported)
	}
	h.exportAll()
	h.notify()
	return kept
}

// snapMark is the tables of a shard's last snapshot: the set, the
// version snapshotted and the set's Writes then.
type snapMark struct {
	set     *TableSet
	version int64
	writes  uint64
}

// advance follows the dense shard to its version (TableSet.Advance).
func (h *tableHost) advance(sh *Shard) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set == nil {
		return nil
	}
	err := h.set.Advance(sh.Version(), sh.LastStep())
	h.done = sh.Done()
	h.exportAll()
	h.notify()
	return err
}

// quarantine follows the dense shard's quarantined workers.
func (h *tableHost) quarantine(sh *Shard) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.quarantined = h.quarantined[:0]
	for w := range sh.Slots() {
		h.quarantined = append(h.quarantined, sh.Quarantined(w))
	}
}

// stop answers every row pull done from now on.
func (h *tableHost) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
	h.notify()
}

// snapshot freezes every table's slots (nil: no tables), appended to
// reuse[:0].
func (h *tableHost) snapshot(reuse []TableSlots, version int64) []TableSlots {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set == nil {
		return nil
	}
	h.snapped = snapMark{set: h.set, version: version, writes: h.set.Writes()}
	return h.set.FreezeSlots(reuse)
}

// exportAll sets every table's metrics. Call with mu held.
func (h *tableHost) exportAll() {
	if h.set == nil {
		return
	}
	for _, name := range h.set.Names() {
		h.export(name)
	}
}

// export sets a table's gauges and adds its counters' growth since the
// last export. Call with mu held.
func (h *tableHost) export(name string) {
	t := h.set.Table(name)
	tm := h.metricsOf(name)
	st, was := t.Stats(), tm.added
	tm.rows.Set(float64(st.Rows))
	tm.bytes.Set(float64(t.Bytes()))
	add := func(c prometheus.Counter, now, before int64) {
		if now > before {
			c.Add(float64(now - before))
		}
	}
	if !h.mirror {
		add(tm.admissions, st.Admissions, was.Admissions)
		add(tm.evictions, st.Evictions, was.Evictions)
		add(tm.dropped, st.Dropped, was.Dropped)
	}
	tm.added = st
}

// check verifies a row request's run. Call with mu held.
func (h *tableHost) check(runID string) error {
	switch {
	case !h.inited:
		return status.Error(codes.Unavailable, "shard not initialised yet (waiting for the chief)")
	case runID != h.runID:
		return status.Errorf(codes.FailedPrecondition, "row request for run %q, this shard serves run %q", runID, h.runID)
	case h.set == nil:
		return status.Error(codes.FailedPrecondition, "this shard holds no embedding tables (the run declared none)")
	}
	return nil
}

// maxPullAnswer bounds the row values one pull may ask for (64 MiB of
// answer), so a small request cannot make the shard allocate without
// limit; a worker's client asks for at most rowclient.DefaultMaxRequestBytes.
const maxPullAnswer = 16 << 20

// serving is check for a worker's (or the chief's reading) request,
// which also waits while the chief loads a restored checkpoint's rows: a
// row read before then would be a new one, not the checkpoint's. Call
// with mu held.
func (h *tableHost) serving(runID string) error {
	if h.refuse != nil {
		return h.refuse
	}
	if err := h.check(runID); err != nil {
		return err
	}
	if h.loading {
		return status.Error(codes.Unavailable, "the shard's embedding rows are being loaded from a checkpoint")
	}
	return nil
}

// tableStatus maps a TableSet error to a gRPC status.
func tableStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrNotMine), errors.Is(err, ErrNoTable), errors.Is(err, ErrBadLength),
		errors.Is(err, ErrFutureVersion), errors.Is(err, ErrNonFinite), errors.Is(err, ErrBadWorker):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// requestKeys is a request block's keys, from whichever field holds
// them.
func requestKeys(b *pb.RowBlock) ([]uint64, error) {
	if len(b.Keys) > 0 && len(b.SmallKeys) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "table %s: keys in both keys and small_keys", b.Table)
	}
	if len(b.SmallKeys) > 0 {
		return b.SmallKeys, nil
	}
	return b.Keys, nil
}

// pullBlocks reads a pull's row blocks, each with room for its rows (of
// its table's dimension) in the memory rows returns (nil: new memory).
// Call with mu held.
func (h *tableHost) pullBlocks(in []*pb.RowBlock, rows func(n int) []float32) ([]RowBlock, error) {
	out := make([]RowBlock, len(in))
	answer := 0 // values the answer holds
	for i, b := range in {
		keys, err := requestKeys(b)
		if err != nil {
			return nil, err
		}
		t := h.set.Table(b.Table)
		if t == nil {
			return nil, tableStatus(fmt.Errorf("%w: %q", ErrNoTable, b.Table))
		}
		if answer += len(keys) * t.Config().Dim; answer > maxPullAnswer {
			return nil, status.Errorf(codes.InvalidArgument, "a pull of more than %d row values (%d MiB): ask for fewer keys at a time", maxPullAnswer, maxPullAnswer*4>>20)
		}
		out[i] = RowBlock{Table: b.Table, Keys: keys}
	}
	var all []float32
	if rows != nil {
		all = rows(answer)
	} else {
		all = make([]float32, answer)
	}
	for i := range out {
		n := len(out[i].Keys) * h.set.Table(out[i].Table).Config().Dim
		out[i].Values, all = all[:n:n], all[n:]
	}
	return out, nil
}

// pushBlocks reads a push's row blocks: their gradients as float32
// (views of the request's bytes where aligned). Call with mu held.
func (h *tableHost) pushBlocks(in []*pb.RowBlock) ([]RowBlock, error) {
	out := make([]RowBlock, len(in))
	for i, b := range in {
		keys, err := requestKeys(b)
		if err != nil {
			return nil, err
		}
		v, err := wire.Floats(b.Values)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		out[i] = RowBlock{Table: b.Table, Keys: keys, Values: v}
	}
	return out, nil
}

// count adds a request's keys to the row requests (of pushes, or of
// pulls) and exports the tables it touched. Call with mu held.
func (h *tableHost) count(push bool, blocks []RowBlock) {
	for _, b := range blocks {
		tm := h.metricsOf(b.Table)
		c := tm.pulled
		if push {
			c = tm.pushed
		}
		c.Add(float64(len(b.Keys)))
		if h.set.Table(b.Table) != nil {
			h.export(b.Table)
		}
	}
}

// keyBytes is what a block's keys take in its message: 8 bytes each, or
// their varints (rowclient sends whichever is smaller).
func keyBytes(b *pb.RowBlock) int {
	n := 8 * len(b.Keys)
	for _, k := range b.SmallKeys {
		n += protowire.SizeVarint(k)
	}
	return n
}

// PullRows answers a row pull once the tables are at the request's
// version (sync), or at once.
func (s *Server) PullRows(ctx context.Context, req *pb.PullRowsRequest) (*pb.PullRowsResponse, error) {
	resp, _, err := s.pullRows(ctx, req, true, nil)
	return resp, err
}

// PullRowsNow is PullRows for a pull that need not wait: one of a
// version the tables are at, or any pull but a sync one. ready is false,
// and nothing done or counted, when the pull would wait (a data plane
// then waits in PullRows, watching its client meanwhile). The answer's
// rows are written into the memory rows returns for their n values
// (nil: new memory): a data plane's connection lends its own.
func (s *Server) PullRowsNow(req *pb.PullRowsRequest, rows func(n int) []float32) (resp *pb.PullRowsResponse, ready bool, err error) {
	return s.pullRows(context.Background(), req, false, rows)
}

// pullRows is PullRows, waiting for the request's version if wait, else
// answering not ready; its rows go into rows' memory (nil: new). A
// worker's pull to a primary with a standby is queued for the standby
// and answered once the standby holds it (lockRows): such a pull waits
// in PullRows, never in PullRowsNow.
func (s *Server) pullRows(ctx context.Context, req *pb.PullRowsRequest, wait bool, rows func(n int) []float32) (*pb.PullRowsResponse, bool, error) {
	start := s.now()
	h := s.tables
	var both bool // the Server's lock is held too
	for {
		// (A pull that may not wait never takes the Server's lock: one
		// to be replicated declines, and waits in PullRows.)
		both = s.lockRows(wait && req.Worker >= 0)
		if !wait && req.Worker >= 0 && h.replicating {
			s.unlockRows(both)
			return nil, false, nil
		}
		ready, err := h.pullReady(req)
		if err != nil {
			s.unlockRows(both)
			s.countPullRows(req, start, 0)
			return nil, true, err
		}
		if ready {
			break
		}
		if !wait {
			s.unlockRows(both)
			return nil, false, nil
		}
		ch := h.changed
		s.unlockRows(both)
		select {
		case <-ch:
		case <-ctx.Done():
			s.countPullRows(req, start, 0)
			return nil, true, status.FromContextError(ctx.Err()).Err()
		}
	}
	resp, sent, w, err := s.pullLocked(req, rows, both)
	s.unlockRows(both)
	if err == nil {
		if err = s.awaitReplica(ctx, w); err != nil {
			resp, sent = nil, 0
		}
	}
	s.countPullRows(req, start, sent)
	return resp, true, err
}

// pullLocked answers a ready row pull (pull) and, with both locks held
// (lockRows), queues it for the standby: what its answer waits for.
func (s *Server) pullLocked(req *pb.PullRowsRequest, rows func(n int) []float32, both bool) (*pb.PullRowsResponse, int, replicaWait, error) {
	h := s.tables
	var writes uint64
	if both {
		writes = h.set.Writes() // (only on a pull that may be replicated: none without a standby)
	}
	resp, sent, err := h.pull(req, rows, true)
	var w replicaWait
	switch {
	case !both || err != nil:
	case h.set.PullsOnlyCreate() && h.set.Writes() == writes:
		// It changed nothing: the standby need not apply it, only hold
		// every update before it (as a dense pull waits).
		w = s.lastQueued()
	default:
		w = s.replicate(&pb.ReplicaOp{Op: &pb.ReplicaOp_PullRows{PullRows: clonePullRows(req)}}, nil)
	}
	return resp, sent, w, err
}

// countPullRows counts a row pull that began at start and sent sent
// bytes of rows.
func (s *Server) countPullRows(req *pb.PullRowsRequest, start time.Time, sent int) {
	received := 0
	for _, b := range req.Tables {
		received += keyBytes(b)
	}
	s.m.RPCReceivedBytes.WithLabelValues("pull_rows").Add(float64(received))
	s.m.RPCSentBytes.WithLabelValues("pull_rows").Add(float64(sent))
	s.observe("pull_rows", start)
}

// pullReady says whether a row pull may be answered now. Call with mu
// held.
func (h *tableHost) pullReady(req *pb.PullRowsRequest) (bool, error) {
	if err := h.serving(req.RunId); err != nil {
		return false, err
	}
	return h.done || h.set.mode != config.Sync || (req.Generation != 0 && req.Generation != h.gen) ||
		h.set.Version() >= req.MinVersion, nil
}

// pull answers a ready row pull, its rows in rows' memory (nil: new),
// and the payload's bytes. Call with mu held.
func (h *tableHost) pull(req *pb.PullRowsRequest, rows func(n int) []float32, count bool) (*pb.PullRowsResponse, int, error) {
	blocks, err := h.pullBlocks(req.Tables, rows)
	if err != nil {
		return nil, 0, err
	}
	// The chief's pulls (its evaluations) read the rows without sighting
	// them: held-out keys create no row and count for no admission.
	if err := h.set.PullBlocks(int(req.Worker), blocks); err != nil {
		return nil, 0, tableStatus(err)
	}
	if count {
		h.count(false, blocks)
	}
	resp := &pb.PullRowsResponse{Version: h.set.Version(), Generation: h.gen, Done: h.done, Tables: make([]*pb.RowBlock, len(blocks))}
	sent := 0
	for i, b := range blocks {
		// (A view of the answer's rows: new memory, or what a data-plane
		// connection lent, which it writes out before its next request.)
		v := wire.Bytes(b.Values)
		resp.Tables[i] = &pb.RowBlock{Table: b.Table, Values: v}
		sent += len(v)
	}
	return resp, sent, nil
}

// PushRows applies or stages a worker's row gradients. To a primary
// with a standby it is queued for the standby and answered once the
// standby holds it.
func (s *Server) PushRows(ctx context.Context, req *pb.PushRowsRequest) (*pb.PushRowsResponse, error) {
	defer s.observe("push_rows", s.now())
	received := 0
	for _, b := range req.Tables {
		received += keyBytes(b) + len(b.Values)
	}
	s.m.RPCReceivedBytes.WithLabelValues("push_rows").Add(float64(received))
	both := s.lockRows(true)
	h := s.tables
	if err := h.serving(req.RunId); err != nil {
		s.unlockRows(both)
		return nil, err
	}
	resp, err := h.push(req, s.m)
	var w replicaWait
	if both && err == nil {
		w = s.replicate(&pb.ReplicaOp{Op: &pb.ReplicaOp_PushRows{PushRows: clonePushRows(req)}}, nil)
	}
	s.unlockRows(both)
	if err != nil {
		return nil, err
	}
	if err := s.awaitReplica(ctx, w); err != nil {
		return nil, err
	}
	return resp, nil
}

// push applies or stages a row push that passed serving (a worker's) or
// check (its primary's, on a standby), counting it in m's series (nil: a
// standby's, which its primary counts). Call with mu held.
func (h *tableHost) push(req *pb.PushRowsRequest, m *metrics.PS) (*pb.PushRowsResponse, error) {
	stale := &pb.PushRowsResponse{Outcome: pb.PushResponse_STALE, Version: h.set.Version(), Done: h.done}
	w := int(req.Worker)
	if h.done || (req.Generation != 0 && req.Generation != h.gen) || (w >= 0 && w < len(h.quarantined) && h.quarantined[w]) {
		return stale, nil // training over, rows of a rolled-back timeline, or of a quarantined worker
	}
	blocks, err := h.pushBlocks(req.Tables)
	if err != nil {
		return nil, err
	}
	out, err := h.set.PushBlocks(w, req.Version, blocks)
	switch {
	case errors.Is(err, ErrNonFinite) && h.nanSkip:
		if m != nil {
			m.RejectedRequests.WithLabelValues("non_finite").Inc()
		}
		return stale, nil // --nan-policy skip: dropped, training goes on
	case err != nil:
		if m != nil {
			m.RejectedRequests.WithLabelValues(rejectReason(err)).Inc()
		}
		return nil, tableStatus(err)
	}
	if m != nil {
		h.count(true, blocks)
	}
	return &pb.PushRowsResponse{Outcome: pb.PushResponse_Outcome(out), Version: h.set.Version(), Done: h.done}, nil
}

// maxRowsToCome bounds the rows a LoadRows request may ask room for
// (LoadRowsRequest.rows_to_come): room for 2^26 rows is up to 1 GiB of
// index (Reserve rounds each part up to a power of two, with an eighth
// to spare). A larger figure is ignored, and the table grows as rows
// come.
const maxRowsToCome = 1 << 26

// LoadRows puts restored rows into a table (the chief's restore).
func (s *Server) LoadRows(ctx context.Context, req *pb.LoadRowsRequest) (*pb.LoadRowsResponse, error) {
	defer s.observe("load_rows", s.now())
	resp, err := s.tables.loadRows(ctx, req)
	if err == nil && req.Done {
		// (After the tables' lock: a standby's snapshot waited for the
		// rows, and is taken under the Server's lock, then the tables'.)
		s.rowsLoaded()
	}
	return resp, err
}

// loadRows is LoadRows' work on the tables.
func (h *tableHost) loadRows(ctx context.Context, req *pb.LoadRowsRequest) (*pb.LoadRowsResponse, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refuse != nil {
		return nil, h.refuse // (a standby's rows are its primary's)
	}
	if err := h.check(req.RunId); err != nil {
		return nil, err
	}
	if req.Generation != h.gen {
		return nil, status.Errorf(codes.FailedPrecondition, "rows for generation %d, the shard's tables are of generation %d", req.Generation, h.gen)
	}
	if err := ctx.Err(); err != nil {
		// The chief gave up on this request while it waited (its
		// attempt ended): a later attempt loads the rows again.
		return nil, status.FromContextError(err).Err()
	}
	if req.Done {
		h.loading = false
		h.notify()
		return &pb.LoadRowsResponse{}, nil
	}
	if !h.loading {
		// (Rows come only between an Init that loads a checkpoint and
		// the load's end: a late copy must not change a shard that
		// serves, or its standby would not hold the change.)
		return nil, status.Error(codes.FailedPrecondition, "rows to load into a shard that is not loading any (its load is done)")
	}
	t := h.set.Table(req.Table)
	if t == nil {
		return nil, tableStatus(fmt.Errorf("%w: %q", ErrNoTable, req.Table))
	}
	if n := req.RowsToCome; n > 0 && n <= maxRowsToCome {
		t.Reserve(t.Len() + int(n))
	}
	vals, err := wire.Floats(req.Values)
	if err == nil {
		var state []float32
		if state, err = wire.Floats(req.State); err == nil {
			cfg := t.Config()
			err = h.set.Load(shardckpt.TableRows{Name: req.Table, Kind: cfg.Rule.Kind, Dim: cfg.Dim, StateLen: cfg.Rule.StateLen(cfg.Dim),
				Keys: req.Keys, Values: vals, State: state})
		}
	}
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	h.export(req.Table)
	return &pb.LoadRowsResponse{Rows: int64(t.Len())}, nil
}

// current is the shard's tables (nil: none).
func (h *tableHost) current() *TableSet {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.set
}

// loadFromCheckpoint loads onto set, the tables an Init installed with
// rows_loading, the rows of the committed checkpoint of step in store
// that the layout of n shards places on shard s: from the files of the
// shards whose keys can be s's (embed.ShardsMeet), but the one s wrote
// when it kept its rows (kept: those are in). Each file is read and
// hashed on its own without the lock, keeping its tables only; its rows
// go in under it (Table.Load makes room for them). Row requests wait
// until the end, as for the chief's LoadRows. An Init that replaces set
// meanwhile (a retry of the same one, say) ends the load: set is no
// longer the shard's, and the tables the new Init installed wait for
// their own load. It returns the rows loaded.
func (h *tableHost) loadFromCheckpoint(ctx context.Context, store *checkpoint.Store, step int64, s, n int, kept bool, set *TableSet) (int64, error) {
	if store == nil {
		return 0, fmt.Errorf("this PS has no checkpoint directory")
	}
	ck, err := store.Load(store.Path(step))
	if err != nil {
		return 0, err
	}
	isTable := func(name string) bool { return strings.HasPrefix(name, shardckpt.TablePrefix) }
	var loaded int64
	from := len(ck.Manifest.Shards)
	for i, sh := range ck.Manifest.Shards {
		if (kept && sh.Index == s) || !embed.ShardsMeet(sh.Index, from, s, n) {
			continue // (rows it kept, or none of them are s's)
		}
		if err := ctx.Err(); err != nil {
			return loaded, err
		}
		tensors, _, err := ck.ReadShardSome(i, isTable)
		if err != nil {
			return loaded, err
		}
		tables, err := shardckpt.TablesOf(tensors, sh.File)
		if err != nil {
			return loaded, err
		}
		for _, t := range tables {
			mine := shardckpt.RowsOn(t, s, n)
			if err := h.loadInto(ctx, set, mine); err != nil {
				return loaded, fmt.Errorf("%s: %w", sh.File, err)
			}
			loaded += int64(len(mine.Keys))
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.still(ctx, set); err != nil {
		return loaded, err
	}
	h.loading = false
	h.exportAll()
	h.notify()
	return loaded, nil
}

// loadInto loads rows onto set, if it is still the shard's tables and
// ctx has not ended.
func (h *tableHost) loadInto(ctx context.Context, set *TableSet, rows shardckpt.TableRows) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.still(ctx, set); err != nil {
		return err
	}
	return set.Load(rows)
}

// still says why a load onto set stops: ctx ended, or an Init replaced
// set. Call with mu held.
func (h *tableHost) still(ctx context.Context, set *TableSet) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if h.set != set {
		return fmt.Errorf("the shard was initialised again during the load (generation %d)", h.gen)
	}
	return nil
}
