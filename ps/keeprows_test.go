package ps

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

// keepRig is shard 0 of 2 of an async run with one table, trained on
// the keys placed on it, then checkpointed: the state a live change of
// the PS count finds a shard in (docs/elastic.md).
type keepRig struct {
	srv     *Server
	spec    model.Spec
	table   embed.TableConfig
	opts    *pb.ShardOptions
	keys    []uint64 // the shard's keys, each trained once
	version int64    // the checkpoint's
	fs      *checkpoint.MemFS
}

func newKeepRig(t *testing.T) *keepRig {
	t.Helper()
	r := config.Default()
	r.Mode, r.Workers, r.PS, r.LRSchedule = config.Async, 1, 2, "constant"
	g := &keepRig{spec: model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}, opts: OptionsFor(r).Proto(),
		table: embed.TableConfig{Name: "emb/C1", Dim: 2, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}
	g.fs = checkpoint.NewMemFS()
	store := checkpoint.NewStore(g.fs, "/ck", 0)
	g.srv = NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard, Store: store})
	ctx := context.Background()
	if _, err := g.srv.Init(ctx, g.init(2, 0, 1)); err != nil {
		t.Fatal(err)
	}
	place := embed.PlacerOf(g.table.Name, 2)
	for k := uint64(1); len(g.keys) < 300; k++ {
		if place.Shard(k) == 0 {
			g.keys = append(g.keys, k)
		}
	}
	g.train(t, g.keys)
	ck, err := g.srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 1, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	g.version = ck.Version
	return g
}

// init is the Init of shard 0 of n at version in generation gen.
func (g *keepRig) init(n int, version, gen int64) *pb.InitRequest {
	plan, err := partition.New(g.spec, n)
	if err != nil {
		panic(err)
	}
	return &pb.InitRequest{RunId: "r", NumShards: int32(n), ShardOptions: g.opts, Generation: gen, Version: version,
		Params: wire.Bytes(make([]float32, plan.Shards[0].Size)), ModelSpec: convert.ModelSpec(g.spec),
		Tables: TableSpecs([]embed.TableConfig{g.table})}
}

// train pulls keys (creating their rows) and pushes a gradient of 1 for
// each.
func (g *keepRig) train(t *testing.T, keys []uint64) { trainOn(t, g.srv, g.table.Name, keys) }

// trainOn pulls keys of table from srv (creating their rows) and pushes
// a gradient of 1 for each of its 2 values.
func trainOn(t *testing.T, srv *Server, table string, keys []uint64) {
	t.Helper()
	ctx := context.Background()
	if _, err := srv.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Tables: []*pb.RowBlock{{Table: table, Keys: keys}}}); err != nil {
		t.Fatal(err)
	}
	ones := make([]float32, 2*len(keys))
	for i := range ones {
		ones[i] = 1
	}
	if _, err := srv.PushRows(ctx, &pb.PushRowsRequest{RunId: "r", Tables: []*pb.RowBlock{
		{Table: table, Keys: keys, Values: wire.Bytes(ones)}}}); err != nil {
		t.Fatal(err)
	}
}

// rows is the shard's rows now, by key.
func (g *keepRig) rows() map[uint64][]float32 { return rowsOf(g.srv, g.table.Name) }

// rowsOf is srv's rows of table now, by key.
func rowsOf(srv *Server, table string) map[uint64][]float32 {
	h := srv.tables
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[uint64][]float32{}
	tb := h.set.Table(table)
	for _, k := range tb.Keys() {
		row, _, _ := tb.Row(k)
		out[k] = slices.Clone(row)
	}
	return out
}

// withShardParams gives req the zero parameters of shard s of n.
func withShardParams(t *testing.T, g *keepRig, req *pb.InitRequest, n, s int) *pb.InitRequest {
	t.Helper()
	plan, err := partition.New(g.spec, n)
	if err != nil {
		t.Fatal(err)
	}
	req.Shard, req.NumShards = int32(s), int32(n)
	req.Params = wire.Bytes(make([]float32, plan.Shards[s].Size))
	return req
}

// A shard asked to keep its rows at a live change keeps, of the rows
// its checkpoint holds, those the new layout places on it, trained as
// they were; any doubt (a row written since, another version, another
// table) and it starts empty, for the chief to load every row.
func TestInitKeepsTheRowsTheNewLayoutLeaves(t *testing.T) {
	ctx := context.Background()
	g := newKeepRig(t)
	before := g.rows()
	if len(before) != len(g.keys) {
		t.Fatalf("%d rows before the change, want %d", len(before), len(g.keys))
	}
	req := g.init(3, g.version, 2)
	req.KeepRows, req.KeepRowsVersion, req.RowsLoading = true, g.version, true
	resp, err := g.srv.Init(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.RowsKept {
		t.Fatal("the shard did not keep its rows")
	}
	after, place := g.rows(), embed.PlacerOf(g.table.Name, 3)
	var stay int
	for _, k := range g.keys {
		row, held := after[k]
		if on := place.Shard(k) == 0; held != on {
			t.Fatalf("key %d: held %v after the change, placed on shard 0 of 3: %v", k, held, on)
		} else if on {
			stay++
			if !slices.Equal(row, before[k]) {
				t.Fatalf("key %d: row %v after the change, %v before", k, row, before[k])
			}
		}
	}
	if stay == 0 || stay == len(g.keys) {
		t.Fatalf("%d of %d rows stay: the test needs some to leave and some to stay", stay, len(g.keys))
	}
	// The shard's row gauge still shows the table, at its rows.
	if n := testutil.CollectAndCount(g.srv.tables.m.Rows); n != 1 {
		t.Fatalf("%d series of the rows gauge after a kept Init, want 1", n)
	}
	if got := testutil.ToFloat64(g.srv.tables.m.Rows.WithLabelValues(g.table.Name)); got != float64(stay) {
		t.Fatalf("rows gauge %v after a kept Init, %d rows held", got, stay)
	}

	for name, spoil := range map[string]func(g *keepRig, req *pb.InitRequest){
		"a row trained after the snapshot": func(g *keepRig, req *pb.InitRequest) { g.train(t, g.keys[:1]) },
		"a row created after the snapshot": func(g *keepRig, req *pb.InitRequest) {
			if _, err := g.srv.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Tables: []*pb.RowBlock{
				{Table: g.table.Name, Keys: []uint64{g.keys[len(g.keys)-1] + 1e6}}}}); err != nil {
				t.Fatal(err)
			}
		},
		"another version": func(g *keepRig, req *pb.InitRequest) { req.KeepRowsVersion++ },
		"another table rule": func(g *keepRig, req *pb.InitRequest) {
			tc := g.table
			tc.Rule.LR = 0.5
			req.Tables = TableSpecs([]embed.TableConfig{tc})
		},
		"another run":           func(g *keepRig, req *pb.InitRequest) { req.RunId = "other" },
		"no rows to load after": func(g *keepRig, req *pb.InitRequest) { req.RowsLoading = false },
	} {
		g := newKeepRig(t)
		req := g.init(3, g.version, 2)
		req.KeepRows, req.KeepRowsVersion, req.RowsLoading = true, g.version, true
		spoil(g, req)
		resp, err := g.srv.Init(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.RowsKept || len(g.rows()) != 0 {
			t.Errorf("%s: rows kept %v, %d rows held after the Init; want none", name, resp.RowsKept, len(g.rows()))
		}
	}
}
