package ps

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// replTables are the tables of the replication tests: one with Adagrad
// that admits a key at its second sighting and evicts rows unseen for 3
// steps, one with plain SGD.
var replTables = []embed.TableConfig{
	{Name: "emb/A", Dim: 3, Seed: 7, Rule: embed.DefaultAdagrad(0.3), AdmitAfter: 2, EvictAfter: 3},
	{Name: "emb/B", Dim: 2, Seed: 7, Rule: embed.Rule{Kind: embed.SGD, LR: 0.5}},
}

// tablesInit is replicaInit's Init with replTables.
func tablesInit(t *testing.T, epoch int64, standby string) (*pb.InitRequest, int) {
	req, n := replicaInit(t, config.Sync, epoch, standby)
	req.Tables = TableSpecs(replTables)
	return req, n
}

// rowKeys is worker w's keys of table at step i: overlapping the other
// worker's and the steps before, so rows are admitted, shared, left
// unseen and evicted.
func rowKeys(table string, w, i int) []uint64 {
	var keys []uint64
	for j := range 5 {
		k := uint64((3*i + 2*w + j*len(table)) % 23)
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// rowStep is worker w's part of sync step i on s: its dense pull, its
// row pull and row push of every table, then its dense push. The row
// requests go through the server's gRPC methods, as a worker's would.
func rowStep(t *testing.T, s *Server, w, i, n int) {
	t.Helper()
	rowStepOf(t, s, w, i, n, replTables)
}

// rowStepOf is rowStep over tables.
func rowStepOf(t *testing.T, s *Server, w, i, n int, tables []embed.TableConfig) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Pull(ctx, &pb.PullRequest{Worker: int32(w), MinVersion: int64(i), RunId: "r"}); err != nil {
		t.Fatalf("step %d worker %d: pull: %v", i, w, err)
	}
	rowRequests(t, s, w, i, tables)
	if _, err := s.Push(ctx, &pb.PushRequest{Worker: int32(w), Version: int64(i), Grad: wire.Bytes(gradOf(w, i, n)), RunId: "r",
		Generation: 1, DataPosition: int64(i + 1)}); err != nil {
		t.Fatalf("step %d worker %d: push: %v", i, w, err)
	}
}

// rowRequests is worker w's row pull and row push of step i.
func rowRequests(t *testing.T, s *Server, w, i int, tables []embed.TableConfig) {
	t.Helper()
	ctx := context.Background()
	var pull, push []*pb.RowBlock
	for _, c := range tables {
		keys := rowKeys(c.Name, w, i)
		grads := make([]float32, len(keys)*c.Dim)
		for j := range grads {
			grads[j] = float32((w+2)*(j+i)%7-3) / 4
		}
		pull = append(pull, &pb.RowBlock{Table: c.Name, Keys: keys})
		push = append(push, &pb.RowBlock{Table: c.Name, Keys: keys, Values: wire.Bytes(grads)})
	}
	if _, err := s.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Worker: int32(w), Generation: 1, MinVersion: int64(i), Tables: pull}); err != nil {
		t.Fatalf("step %d worker %d: row pull: %v", i, w, err)
	}
	if _, err := s.PushRows(ctx, &pb.PushRowsRequest{RunId: "r", Worker: int32(w), Generation: 1, Version: int64(i), Tables: push}); err != nil {
		t.Fatalf("step %d worker %d: row push: %v", i, w, err)
	}
}

// tablesOf is s's tables' whole state: what a snapshot carries of it,
// and every row with its state and last sighting.
type tablesImage struct {
	state   *pb.TablesState
	rows    []*pb.ReplicaOp // a table's each, keys increasing
	version int64
}

func tablesOf(t *testing.T, s *Server) tablesImage {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.tables
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set == nil {
		t.Fatal("no tables")
	}
	img := tablesImage{state: h.set.stateProto(), version: h.set.Version()}
	for _, ts := range h.set.FreezeSlots(nil) {
		img.rows = append(img.rows, &pb.ReplicaOp{Op: &pb.ReplicaOp_Rows{Rows: sortedRows(ts)}})
	}
	return img
}

// sortedRows is a table's frozen rows, keys increasing, each with its
// last sighting.
func sortedRows(ts TableSlots) *pb.TableRowsChunk {
	f := newRowFeed(ts, true)
	var all pb.TableRowsChunk
	f.next(&all, f.live)
	d, sl := ts.Slots.Dim, ts.Slots.StateLen
	vals, _ := wire.Floats(all.Values)
	state, _ := wire.Floats(all.State)
	order := make([]int, len(all.Keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(all.Keys[a], all.Keys[b]) })
	out := &pb.TableRowsChunk{Table: ts.Name}
	var v, st []float32
	for _, i := range order {
		out.Keys = append(out.Keys, all.Keys[i])
		out.LastSeen = append(out.LastSeen, all.LastSeen[i])
		v, st = append(v, vals[i*d:(i+1)*d]...), append(st, state[i*sl:(i+1)*sl]...)
	}
	out.Values, out.State = wire.Bytes(v), wire.Bytes(st)
	return out
}

// sameTables fails unless a and b are the same tables, bit for bit.
func sameTables(t *testing.T, what string, a, b tablesImage) {
	t.Helper()
	if a.version != b.version || !proto.Equal(a.state, b.state) || len(a.rows) != len(b.rows) {
		t.Fatalf("%s: tables at version %d and %d differ in their state or tables:\n%v\n%v", what, a.version, b.version, a.state, b.state)
	}
	for i := range a.rows {
		if !proto.Equal(a.rows[i], b.rows[i]) {
			t.Fatalf("%s: the rows of %s differ", what, a.rows[i].GetRows().Table)
		}
	}
}

// A hot standby holds its primary's tables bit for bit (rows, optimizer
// state, last sightings, keys waiting for admission, the step's staged
// rows and sightings, the counters) at every step, the primary's tables
// are what a shard without a standby holds, and once promoted the
// standby trains on as the primary would have: the same tables as a
// shard that never failed.
func TestStandbyHoldsThePrimarysTables(t *testing.T) {
	var l, back *link
	primary := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)})
	standby := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&back)})
	l, back = &link{to: standby}, &link{to: primary}
	t.Cleanup(primary.Close)
	t.Cleanup(standby.Close)
	alone := NewServer(Config{Log: quietLog(), Shard: AnyShard})
	ctx := context.Background()
	req, n := tablesInit(t, 1, "standby")
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	req, _ = tablesInit(t, 1, "")
	if _, err := alone.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, primary)
	if _, err := standby.PushRows(ctx, &pb.PushRowsRequest{RunId: "r", Worker: 0, Generation: 1}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a standby took a worker's row push: %v", err)
	}
	if _, err := standby.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Worker: 0, Generation: 1}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a standby took a worker's row pull: %v", err)
	}
	const steps, failAt = 12, 7
	for i := range failAt {
		for w := range 2 {
			rowStep(t, primary, w, i, n)
			rowStep(t, alone, w, i, n)
			// Every request was answered, so the standby holds it.
			sameTables(t, "standby and primary", tablesOf(t, standby), tablesOf(t, primary))
			sameTables(t, "primary and a shard without a standby", tablesOf(t, primary), tablesOf(t, alone))
		}
	}
	if st := tablesOf(t, alone).state; st.Tables[0].Evictions == 0 || st.Tables[0].Admissions == 0 || len(st.Tables[0].WaitingKeys) == 0 {
		t.Fatalf("the steps admitted, evicted or left waiting no key of %s: %v", replTables[0].Name, st.Tables[0])
	}
	// The standby's counters of rows admitted and requests are its
	// primary's to export.
	admitted := func(s *Server) float64 {
		return testutil.ToFloat64(s.tables.m.Admissions.WithLabelValues(replTables[0].Name))
	}
	pulled := func(s *Server) float64 {
		return testutil.ToFloat64(s.tables.m.RowRequests.WithLabelValues(replTables[0].Name, "pull"))
	}
	if admitted(primary) == 0 || pulled(primary) == 0 || admitted(standby) != 0 || pulled(standby) != 0 {
		t.Fatalf("admissions and row pulls counted: primary %g and %g, standby %g and %g; want the primary's only",
			admitted(primary), pulled(primary), admitted(standby), pulled(standby))
	}
	// Mid-step: worker 0's rows are staged when the primary dies.
	rowStep(t, primary, 0, failAt, n)
	rowStep(t, alone, 0, failAt, n)
	l.mu.Lock()
	l.cut = true
	l.mu.Unlock()
	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	sameTables(t, "promoted standby, mid-step", tablesOf(t, standby), tablesOf(t, alone))
	rowStep(t, standby, 1, failAt, n)
	rowStep(t, alone, 1, failAt, n)
	for i := failAt + 1; i < steps; i++ {
		for w := range 2 {
			rowStep(t, standby, w, i, n)
			rowStep(t, alone, w, i, n)
		}
	}
	sameTables(t, "promoted standby at the end", tablesOf(t, standby), tablesOf(t, alone))
	if admitted(standby) == 0 || pulled(standby) == 0 {
		t.Errorf("the promoted standby counted %g admissions and %g row pulls since, want some", admitted(standby), pulled(standby))
	}
}

// linkedToStandby is a primary whose link, in memory, reaches a fresh
// server: its standby once a snapshot attaches it (no link back).
func linkedToStandby(t *testing.T) (primary, standby *Server, l *link) {
	t.Helper()
	primary = NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)})
	standby = NewServer(Config{Log: quietLog(), Shard: AnyShard})
	l = &link{to: standby}
	t.Cleanup(primary.Close)
	return primary, standby, l
}

// A standby attached mid-step, while a worker's rows are staged and keys
// wait for admission, starts from a snapshot holding them: once the step
// and the next ones are done its tables are its primary's.
func TestStandbyAttachedMidStepGetsTheStagedRows(t *testing.T) {
	primary, standby, _ := linkedToStandby(t)
	ctx := context.Background()
	req, n := tablesInit(t, 1, "")
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		for w := range 2 {
			rowStep(t, primary, w, i, n)
		}
	}
	rowStep(t, primary, 0, 4, n)
	if _, err := primary.SetStandby(ctx, &pb.SetStandbyRequest{RunId: "r", Shard: 0, Epoch: 2, Addr: "standby"}); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, primary)
	sameTables(t, "standby attached mid-step", tablesOf(t, standby), tablesOf(t, primary))
	if st := tablesOf(t, standby).state; len(st.Tables[0].Staged) == 0 || len(st.Tables[0].Sighted) == 0 || len(st.Tables[0].WaitingKeys) == 0 {
		t.Fatalf("the snapshot was taken with no staged rows, sightings or keys waiting for admission: %v", st.Tables[0])
	}
	rowStep(t, primary, 1, 4, n)
	for w := range 2 {
		rowStep(t, primary, w, 5, n)
	}
	sameTables(t, "standby two steps later", tablesOf(t, standby), tablesOf(t, primary))
}

// A snapshot's rows travel as several operations, written from the
// tables' frozen slots as the link sends them while the primary goes on
// alone: rows the primary writes meanwhile (the steps' keys, held before
// the snapshot and frozen with it) reach the standby as its updates,
// after the snapshot's rows, which keep their values of the snapshot
// (were they read from the live tables, the standby would apply those
// updates twice). The standby cannot be promoted before it holds them
// all; then it holds its primary's tables.
func TestStandbyGetsTheRowsOfALargeSnapshot(t *testing.T) {
	primary, standby, l := linkedToStandby(t)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	l.gate = func(b *pb.ReplicaBatch) {
		if b.Ops[0].GetRows() != nil {
			once.Do(func() {
				close(held)
				<-release
			})
		}
	}
	ctx := context.Background()
	req, n := tablesInit(t, 1, "")
	// Enough pre-filled rows of emb/B for several batches of rows
	// operations: the steps' rows, made after them, are in the last.
	const prefill = 12 * snapshotRowsChunk
	req.Tables[1].PrefillRows = prefill
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		for w := range 2 {
			rowStep(t, primary, w, i, n)
		}
	}
	before := tablesOf(t, primary)
	if _, err := primary.SetStandby(ctx, &pb.SetStandbyRequest{RunId: "r", Shard: 0, Epoch: 2, Addr: "standby"}); err != nil {
		t.Fatal(err)
	}
	<-held // the snapshot is installed; its first rows wait, the rest are not written yet
	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 3}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a standby without the snapshot's rows was promoted: %v", err)
	}
	for i := 3; i < 6; i++ {
		for w := range 2 {
			rowStep(t, primary, w, i, n) // answered alone, writing frozen rows
		}
	}
	close(release)
	waitAttached(t, primary)
	img := tablesOf(t, primary)
	if proto.Equal(img.rows[1], before.rows[1]) {
		t.Fatal("the steps during the transfer wrote no row of the snapshot's")
	}
	sameTables(t, "standby after a snapshot of many rows operations", tablesOf(t, standby), img)
	if got := len(img.rows[1].GetRows().Keys); got < prefill {
		t.Fatalf("the primary holds %d rows of %s, want the %d pre-filled and more", got, replTables[1].Name, prefill)
	}
	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 3}); err != nil {
		t.Fatalf("promoting the standby once it holds the rows: %v", err)
	}
}

// A primary whose rows are being loaded from a checkpoint (an Init with
// rows_loading) attaches its standby only once the load is done, from a
// snapshot holding the loaded rows; meanwhile it goes on alone.
func TestStandbyWaitsForTheRowsBeingLoaded(t *testing.T) {
	primary, standby, _ := linkedToStandby(t)
	ctx := context.Background()
	req, n := tablesInit(t, 1, "standby")
	req.RowsLoading = true
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	c := replTables[1]
	keys := []uint64{2, 5, 11}
	vals := make([]float32, len(keys)*c.Dim)
	for i := range vals {
		vals[i] = float32(i) / 3
	}
	if _, err := primary.LoadRows(ctx, &pb.LoadRowsRequest{RunId: "r", Generation: 1, Table: c.Name, Keys: keys, Values: wire.Bytes(vals)}); err != nil {
		t.Fatal(err)
	}
	if st, err := primary.Status(ctx, &pb.StatusRequest{}); err != nil || st.StandbyAttached || st.ReplicationLagUpdates != 0 {
		t.Fatalf("during the load: %v, standby attached %t with %d updates queued, want neither", err, st.GetStandbyAttached(), st.GetReplicationLagUpdates())
	}
	if _, err := primary.LoadRows(ctx, &pb.LoadRowsRequest{RunId: "r", Generation: 1, Done: true}); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, primary)
	if _, err := primary.LoadRows(ctx, &pb.LoadRowsRequest{RunId: "r", Generation: 1, Table: c.Name, Keys: []uint64{20}, Values: wire.Bytes(vals[:c.Dim])}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("rows loaded after the load's end: %v, want FailedPrecondition", err)
	}
	for w := range 2 {
		rowStep(t, primary, w, 0, n)
	}
	img := tablesOf(t, primary)
	sameTables(t, "standby attached after the load", tablesOf(t, standby), img)
	if !slices.Contains(img.rows[1].GetRows().Keys, 11) {
		t.Fatalf("the loaded rows are not in the tables: %v", img.rows[1].GetRows().Keys)
	}
}

// Where no table admits after sightings or evicts, a pull changes the
// tables only by creating rows: a pull that creates none is answered
// once the standby holds every update before it, and is not sent. The
// standby's tables stay its primary's, and promoted it trains on as a
// shard that never failed would.
func TestStandbyIsNotSentPullsThatChangeNothing(t *testing.T) {
	tables := replTables[1:] // emb/B: admits at once, evicts nothing
	var l, back *link
	primary := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)})
	standby := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&back)})
	var mu sync.Mutex
	sent := 0 // row pulls the standby was sent
	l, back = &link{to: standby, gate: func(b *pb.ReplicaBatch) {
		mu.Lock()
		defer mu.Unlock()
		for _, op := range b.Ops {
			if op.GetPullRows() != nil {
				sent++
			}
		}
	}}, &link{to: primary}
	t.Cleanup(primary.Close)
	t.Cleanup(standby.Close)
	alone := NewServer(Config{Log: quietLog(), Shard: AnyShard})
	ctx := context.Background()
	var n int
	for _, x := range []struct {
		s       *Server
		standby string
	}{{primary, "standby"}, {alone, ""}} {
		var req *pb.InitRequest
		req, n = tablesInit(t, 1, x.standby)
		req.Tables = TableSpecs(tables)
		if _, err := x.s.Init(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	waitAttached(t, primary)
	const steps = 12 // (rowKeys repeats its keys within 8 steps)
	for i := range steps {
		for w := range 2 {
			rowStepOf(t, primary, w, i, n, tables)
			rowStepOf(t, alone, w, i, n, tables)
			sameTables(t, "standby and primary", tablesOf(t, standby), tablesOf(t, primary))
		}
	}
	mu.Lock()
	got := sent
	mu.Unlock()
	if got == 0 || got >= 2*steps {
		t.Fatalf("%d of %d row pulls sent to the standby: want those that created rows only, some but not all", got, 2*steps)
	}
	l.mu.Lock()
	l.cut = true
	l.mu.Unlock()
	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	for i := steps; i < steps+3; i++ {
		for w := range 2 {
			rowStepOf(t, standby, w, i, n, tables)
			rowStepOf(t, alone, w, i, n, tables)
		}
	}
	sameTables(t, "promoted standby", tablesOf(t, standby), tablesOf(t, alone))
	t.Logf("%d of %d row pulls sent to the standby", got, 2*steps)
}
