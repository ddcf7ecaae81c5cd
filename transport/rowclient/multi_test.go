package rowclient

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/transport/auth"
)

// TestSplitPacksTablesIntoRequests: a call's keys over several tables
// go to the shard embed.ShardOf gives each, every key once, packed into
// requests of at most maxBytes of rows (8 + 4 x dim a key); with room
// enough, one request a shard carries every table.
func TestSplitPacksTablesIntoRequests(t *testing.T) {
	tables := []embed.TableRows{{Table: "emb/C1", Keys: []uint64{1, 2, 3, 4, 5, 6, 7}}, {Table: "emb/C2"},
		{Table: "emb/C3", Keys: []uint64{10, 20, 30, 40, 50}}}
	dims := []int{2, 0, 4}
	for _, maxBytes := range []int{1, 40, 100, 1 << 20} {
		reqs := split(tables, dims, 3, maxBytes)
		seen := map[[2]int]int{}
		for s, rs := range reqs {
			for _, r := range rs {
				bytes := 0
				for _, b := range r.blocks {
					for _, i := range b.idx {
						seen[[2]int{b.t, i}]++
						if got := embed.ShardOf(tables[b.t].Table, tables[b.t].Keys[i], 3); got != s || r.shard != s {
							t.Errorf("max %d: key %d of %s in a request to shard %d, its shard is %d", maxBytes, tables[b.t].Keys[i], tables[b.t].Table, s, got)
						}
						bytes += 8 + 4*dims[b.t]
					}
				}
				if bytes > maxBytes && r.keys() > 1 {
					t.Errorf("max %d: a request of %d keys, %d bytes", maxBytes, r.keys(), bytes)
				}
			}
			if maxBytes == 1<<20 && len(rs) > 1 {
				t.Errorf("shard %d: %d requests with room for all", s, len(rs))
			}
		}
		if len(seen) != 12 {
			t.Errorf("max %d: %d keys sent, want 12", maxBytes, len(seen))
		}
		for k, n := range seen {
			if n != 1 {
				t.Errorf("max %d: key %v sent %d times", maxBytes, k, n)
			}
		}
	}
}

// TestTablesInOneCallMatchOneByOne: pulling (creating the rows),
// pushing and pulling again several tables in one call (PullTables,
// PushTables) trains and reads the same rows as a call per table does.
func TestTablesInOneCallMatchOneByOne(t *testing.T) {
	cfgs := []embed.TableConfig{{Name: "emb/C1", Dim: 2, Seed: 3, Rule: embed.Rule{Kind: embed.SGD, LR: 1}},
		{Name: "emb/C2", Dim: 3, Seed: 3, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}
	keys := [][]uint64{{1, 2, 3, 4, 5}, {7, 8, 9}}
	grads := [][]float32{filled(10, 0.5), filled(9, 2)}
	read := func(many bool) [][]float32 {
		c := startShards(t, 2)
		c.initMode(t, c.clients(t, auth.RoleChief, 0), cfgs, config.Async)
		cl, err := New(Config{Shards: shardsOf(c.clients(t, auth.RoleWorker, 0)), RunID: "r", Worker: 0, MaxRequestBytes: 40})
		if err != nil {
			t.Fatal(err)
		}
		out := [][]float32{make([]float32, 10), make([]float32, 9)}
		ctx := context.Background()
		if many {
			if err := cl.PullTables(ctx, 0, []embed.TableRows{{Table: "emb/C1", Keys: keys[0], Rows: out[0]}, {Table: "emb/C2", Keys: keys[1], Rows: out[1]}}); err != nil {
				t.Fatal(err)
			}
			if err := cl.PushTables(ctx, 0, []embed.TableRows{{Table: "emb/C1", Keys: keys[0], Rows: grads[0]}, {Table: "emb/C2", Keys: keys[1], Rows: grads[1]}}); err != nil {
				t.Fatal(err)
			}
			if err := cl.PullTables(ctx, 0, []embed.TableRows{{Table: "emb/C1", Keys: keys[0], Rows: out[0]}, {Table: "emb/C2", Keys: keys[1], Rows: out[1]}}); err != nil {
				t.Fatal(err)
			}
			return out
		}
		for i, tc := range cfgs {
			if err := cl.Pull(ctx, 0, tc.Name, keys[i], out[i]); err != nil {
				t.Fatal(err)
			}
			if err := cl.Push(ctx, 0, tc.Name, keys[i], grads[i]); err != nil {
				t.Fatal(err)
			}
			if err := cl.Pull(ctx, 0, tc.Name, keys[i], out[i]); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	one, many := read(false), read(true)
	for i := range one {
		if !slices.Equal(one[i], many[i]) {
			t.Errorf("%s: %v in one call, %v table by table", cfgs[i].Name, many[i], one[i])
		}
		init := make([]float32, len(one[i]))
		for j, k := range keys[i] {
			embed.InitRow(3, cfgs[i].Name, k, init[j*cfgs[i].Dim:(j+1)*cfgs[i].Dim])
		}
		if slices.Equal(one[i], init) {
			t.Errorf("%s: the push changed nothing", cfgs[i].Name)
		}
	}
}

// TestShardsCountWhatTheClientSent: a shard's row payload counters
// (pstrain_rpc_received_bytes_total of pull_rows and push_rows: the keys
// as sent and the gradients; pstrain_rpc_sent_bytes_total of pull_rows:
// the rows) add up to what the client counted it sent and received, the
// bench's bytes per step.
func TestShardsCountWhatTheClientSent(t *testing.T) {
	cfgs := []embed.TableConfig{{Name: "emb/C1", Dim: 4, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}},
		{Name: "emb/C2", Dim: 2, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}
	c := startShards(t, 2)
	c.initMode(t, c.clients(t, auth.RoleChief, 0), cfgs, config.Async)
	cl, err := New(Config{Shards: shardsOf(c.clients(t, auth.RoleWorker, 0)), RunID: "r", Worker: 0, MaxRequestBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	keys := []uint64{3, 300, 70000, 1 << 50}
	tables := []embed.TableRows{{Table: "emb/C1", Keys: keys, Rows: make([]float32, 16)}, {Table: "emb/C2", Keys: keys[:2], Rows: make([]float32, 4)}}
	ctx := context.Background()
	if err := cl.PullTables(ctx, 0, tables); err != nil {
		t.Fatal(err)
	}
	if err := cl.PushTables(ctx, 0, tables); err != nil {
		t.Fatal(err)
	}
	var received, sent float64
	for _, p := range c.shards {
		received += testutil.ToFloat64(p.m.RPCReceivedBytes.WithLabelValues("pull_rows")) + testutil.ToFloat64(p.m.RPCReceivedBytes.WithLabelValues("push_rows"))
		sent += testutil.ToFloat64(p.m.RPCSentBytes.WithLabelValues("pull_rows"))
	}
	st := cl.Stats()
	if received != float64(st.BytesSent) || sent != float64(st.BytesReceived) {
		t.Errorf("shards received %g and sent %g row bytes; the client sent %d and received %d", received, sent, st.BytesSent, st.BytesReceived)
	}
	if want := 2 * 4 * float64(16+4); sent != want/2 || st.BytesSent <= int64(want/2) {
		t.Errorf("rows sent %g bytes, want %g; client sent %d (gradients %g + keys)", sent, want/2, st.BytesSent, want/2)
	}
}
