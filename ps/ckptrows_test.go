package ps

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/ml/embed"
	pb "github.com/pstrain/pstrain/proto"
)

// ckptRowsRig is the two shards of keepRig's run, each trained on its
// keys and checkpointed at step 1 into one store, the checkpoint
// committed: what a live change of the PS count finds.
type ckptRowsRig struct {
	*keepRig         // shard 0
	one      *Server // shard 1
	store    *checkpoint.Store
	keys1    []uint64             // shard 1's keys
	all      map[uint64][]float32 // every row at the checkpoint, by key
}

func newCkptRowsRig(t *testing.T) *ckptRowsRig {
	t.Helper()
	ctx := context.Background()
	g := &ckptRowsRig{keepRig: newKeepRig(t)}
	g.store = g.srv.store
	g.one = NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard, Store: g.store})
	req := g.init(2, 0, 1)
	req.Shard = 1
	req.Params = req.Params[:0]
	if _, err := g.one.Init(ctx, withShardParams(t, g.keepRig, req, 2, 1)); err != nil {
		t.Fatal(err)
	}
	place := embed.PlacerOf(g.table.Name, 2)
	for k := uint64(1); len(g.keys1) < 300; k++ {
		if place.Shard(k) == 1 {
			g.keys1 = append(g.keys1, k)
		}
	}
	trainOn(t, g.one, g.table.Name, g.keys1)
	ck1, err := g.one.Checkpoint(ctx, &pb.CheckpointRequest{Step: 1, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	// Shard 0 wrote its file at step 1 in newKeepRig; its answer again
	// (a second Checkpoint of the same step rewrites the same file).
	ck0, err := g.srv.Checkpoint(ctx, &pb.CheckpointRequest{Step: 1, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	var shards []checkpoint.ShardInfo
	for i, in := range []*pb.CheckpointResponse{ck0, ck1} {
		shards = append(shards, checkpoint.ShardInfo{Index: i, File: in.File, SHA256: in.Sha256, Bytes: in.Bytes, Tensors: in.Tensors, Version: in.Version})
	}
	if err := g.store.Commit(checkpoint.Manifest{Step: 1, Version: ck0.Version, Mode: "async", Shards: shards}); err != nil {
		t.Fatal(err)
	}
	g.all = g.rows()
	for k, row := range rowsOf(g.one, g.table.Name) {
		g.all[k] = row
	}
	return g
}

// TestInitLoadsTheRowsFromTheCheckpoint: a shard that kept its rows
// loads from the other shard's file the rows the new layout places on
// it (2 -> 1: all of them), a shard new to the layout loads its rows
// from the files that hold them (2 -> 3: shard 1's), each row as the
// checkpoint holds it; row requests wait until then.
func TestInitLoadsTheRowsFromTheCheckpoint(t *testing.T) {
	ctx := context.Background()
	g := newCkptRowsRig(t)
	want := func(s, n int) map[uint64][]float32 {
		place := embed.PlacerOf(g.table.Name, n)
		out := map[uint64][]float32{}
		for k, row := range g.all {
			if place.Shard(k) == s {
				out[k] = row
			}
		}
		return out
	}
	check := func(name string, srv *Server, w map[uint64][]float32, resp *pb.InitResponse, kept bool, loaded int) {
		t.Helper()
		got := rowsOf(srv, g.table.Name)
		if len(got) != len(w) || len(w) == 0 {
			t.Fatalf("%s: %d rows after the Init, want %d", name, len(got), len(w))
		}
		for k, row := range w {
			if !slices.Equal(got[k], row) {
				t.Fatalf("%s: key %d: %v, want %v", name, k, got[k], row)
			}
		}
		if resp.RowsKept != kept || resp.RowsLoaded != int64(loaded) {
			t.Fatalf("%s: rows kept %v, %d loaded; want %v, %d", name, resp.RowsKept, resp.RowsLoaded, kept, loaded)
		}
		if srv.tables.loading {
			t.Fatalf("%s: row requests still wait after the Init", name)
		}
	}
	// Shard 2 of 3, new: all its rows (the upper third of the hash
	// range: shard 1 of 2 held them).
	two := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard, Store: g.store})
	req := withShardParams(t, g.keepRig, g.init(3, g.version, 2), 3, 2)
	req.RowsLoading, req.RowsFromCheckpoint = true, proto.Int64(1)
	resp, err := two.Init(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	w := want(2, 3)
	check("shard 2 of 3, new", two, w, resp, false, len(w))
	// A checkpoint that is not there fails the Init.
	req.RowsFromCheckpoint = proto.Int64(7)
	if _, err := two.Init(ctx, req); err == nil {
		t.Fatal("an Init loading the rows of a checkpoint that does not exist succeeded")
	}
	if !two.tables.loading {
		t.Fatal("row requests are answered after a load that failed")
	}
	// Shard 0 of 1, keeping its rows: loads shard 1's.
	req = g.init(1, g.version, 2)
	req.KeepRows, req.KeepRowsVersion, req.RowsLoading, req.RowsFromCheckpoint = true, g.version, true, proto.Int64(1)
	if resp, err = g.srv.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	check("shard 0 of 1, kept", g.srv, g.all, resp, true, len(g.keys1))
}

// TestInitRefusesADamagedCheckpointsRows: a byte of the other shard's
// file changed, the Init that loads its rows fails, and row requests
// still wait (the switch fails and the layout in effect is restored).
func TestInitRefusesADamagedCheckpointsRows(t *testing.T) {
	ctx := context.Background()
	g := newCkptRowsRig(t)
	ck, err := g.store.Load(g.store.Path(1))
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(g.store.Path(1), ck.Manifest.Shards[1].File)
	f, err := g.fs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(io.NewSectionReader(f, 0, ck.Manifest.Shards[1].Bytes))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 1 // in the data, past the header
	w, err := g.fs.Create(name, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	req := g.init(1, g.version, 2)
	req.KeepRows, req.KeepRowsVersion, req.RowsLoading, req.RowsFromCheckpoint = true, g.version, true, proto.Int64(1)
	if _, err := g.srv.Init(ctx, req); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "SHA-256") {
		t.Fatalf("an Init loading the rows of a damaged file: %v, want FailedPrecondition naming the SHA-256", err)
	}
	if !g.srv.tables.loading {
		t.Fatal("row requests are answered after a load that failed")
	}
}

// TestALoadReplacedByAnotherInitStops: a load whose tables a later Init
// replaced (a retry of the same Init, say) loads nothing onto the new
// tables and does not release their row requests.
func TestALoadReplacedByAnotherInitStops(t *testing.T) {
	ctx := context.Background()
	g := newCkptRowsRig(t)
	two := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Shard: AnyShard, Store: g.store})
	req := withShardParams(t, g.keepRig, g.init(3, g.version, 2), 3, 2)
	req.RowsLoading = true // (no rows_from_checkpoint: nothing loads them)
	if _, err := two.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	first := two.tables.current()
	if _, err := two.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := two.tables.loadFromCheckpoint(ctx, g.store, 1, 2, 3, false, first); err == nil {
		t.Fatal("a load onto tables an Init replaced went on")
	}
	if !two.tables.loading || len(rowsOf(two, g.table.Name)) != 0 {
		t.Fatalf("after the replaced load: row requests wait %t, %d rows held; want true, 0", two.tables.loading, len(rowsOf(two, g.table.Name)))
	}
}
