package rowclient

import (
	"context"
	"fmt"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/ml/embed"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// RestoreShard loads a checkpoint's embedding rows that shard s of n
// holds (embed.ShardOf), with their optimizer state, onto that shard
// (cl, initialised with the tables at generation gen), however many
// shards wrote the checkpoint: what a restore of a shard needs. It holds
// that shard's rows only; LoadRows requests carry at most maxBytes of
// rows (0: DefaultMaxRequestBytes).
func RestoreShard(ctx context.Context, ck *checkpoint.Checkpoint, cl pb.ParameterServerClient, s, n int, runID string, gen int64, maxBytes int) error {
	if s < 0 || s >= n {
		return fmt.Errorf("rowclient: restoring shard %d of %d", s, n)
	}
	rows, err := ShardRows(ck, s, n)
	if err != nil {
		return err
	}
	if err := LoadShard(ctx, cl, rows, runID, gen, maxBytes); err != nil {
		return fmt.Errorf("rowclient: restoring shard %d of %d: %w", s, n, err)
	}
	return nil
}

// ShardRows reads the rows of ck that shard s of n holds
// (embed.ShardOf), however many shards wrote ck.
func ShardRows(ck *checkpoint.Checkpoint, s, n int) ([]shardckpt.TableRows, error) {
	return shardckpt.ReadTables(ck, func(table string, k uint64) bool { return embed.ShardOf(table, k, n) == s })
}

// SplitArriving places the rows byShard[j] (shard j's tables, as
// shardckpt.ReadWithRows reads them) among n shards by embed.ShardOf,
// without the rows that stay on the shard that held them: out[s] is
// what shard s lacks when it kept its own rows through a change to n
// shards (InitResponse.rows_kept), and, for a shard new to the layout,
// all its rows. A table comes in out[s] once for each shard that held
// rows of it going to s, each part in key order (LoadRows asks no more;
// the shard refuses a key it holds already, so a key two shards held
// is still caught). A part whose rows all go to one shard is passed on
// as it is, not copied.
func SplitArriving(byShard [][]shardckpt.TableRows, n int) [][]shardckpt.TableRows {
	out := make([][]shardckpt.TableRows, n)
	count := make([]int, n)
	for j, ts := range byShard {
		for _, t := range ts {
			p := embed.PlacerOf(t.Name, n)
			clear(count)
			dest := make([]int32, len(t.Keys))
			for r, k := range t.Keys {
				dest[r] = int32(p.Shard(k))
				count[dest[r]]++
			}
			for s, c := range count {
				switch {
				case s == j || c == 0: // staying, or none
				case c == len(t.Keys):
					out[s] = append(out[s], t)
				default:
					out[s] = append(out[s], gather(t, dest, int32(s), c))
				}
			}
		}
	}
	return out
}

// gather is the c rows of t whose dest is s, in t's order.
func gather(t shardckpt.TableRows, dest []int32, s int32, c int) shardckpt.TableRows {
	g := t.Empty(c)
	for r, d := range dest {
		if d == s {
			g.Append(t, r)
		}
	}
	return g
}

// SplitRows places tables' rows among n shards by embed.ShardOf: out[s]
// holds the rows ShardRows(ck, s, n) reads, one TableRows a table in the
// order the tables first come in tables. A table may come in parts
// (shardckpt.ReadWithRows gives one per checkpoint shard), each in key
// order as a checkpoint stores them: the parts are merged, so that each
// shard's rows of a table are in key order too, as LoadRows wants them.
// One pass places and counts the keys, so that each shard's arrays are
// allocated once, and one copies the rows. Parts of a table that
// disagree on its shape are refused.
func SplitRows(tables []shardckpt.TableRows, n int) ([][]shardckpt.TableRows, error) {
	var names []string
	parts := map[string][]int{} // a table's parts, by index in tables
	counts := map[string][]int{}
	dest := make([][]int32, len(tables))
	for i, t := range tables {
		if _, ok := parts[t.Name]; !ok {
			names = append(names, t.Name)
			counts[t.Name] = make([]int, n)
		}
		parts[t.Name] = append(parts[t.Name], i)
		p := embed.PlacerOf(t.Name, n)
		dest[i] = make([]int32, len(t.Keys))
		for r, k := range t.Keys {
			s := p.Shard(k)
			dest[i][r] = int32(s)
			counts[t.Name][s]++
		}
	}
	out := make([][]shardckpt.TableRows, n)
	for _, name := range names {
		t := tables[parts[name][0]]
		for _, i := range parts[name] {
			if o := tables[i]; o.Kind != t.Kind || o.Dim != t.Dim || o.StateLen != t.StateLen {
				return nil, fmt.Errorf("rowclient: table %s comes in parts of rule %s, dimension %d and %d state values, and of %s, %d and %d",
					name, t.Kind, t.Dim, t.StateLen, o.Kind, o.Dim, o.StateLen)
			}
		}
		split := make([]shardckpt.TableRows, n)
		for s := range split {
			split[s] = t.Empty(counts[name][s])
		}
		if err := mergeParts(tables, parts[name], dest, split); err != nil {
			return nil, err
		}
		for s := range out {
			out[s] = append(out[s], split[s])
		}
	}
	return out, nil
}

// mergeParts appends the rows of a table's parts (tables[i] for i in
// which, each in key order) to split[dest[i][r]], taking the smallest
// key at the head of a part each time: a few parts, so a scan of the
// heads. The merged keys must increase: a key held twice (by two
// parts, or twice in one) or a part out of key order is refused, as
// ReadTables refuses it (a key's copies would go to the same shard, the
// second overwriting the first).
func mergeParts(tables []shardckpt.TableRows, which []int, dest [][]int32, split []shardckpt.TableRows) error {
	head := make([]int, len(which))
	var last uint64
	for merged := 0; ; merged++ {
		best := -1
		for p, i := range which {
			if head[p] < len(tables[i].Keys) && (best < 0 || tables[i].Keys[head[p]] < tables[which[best]].Keys[head[best]]) {
				best = p
			}
		}
		if best < 0 {
			return nil
		}
		t, r := &tables[which[best]], head[best]
		head[best]++
		if k := t.Keys[r]; merged > 0 && k <= last {
			return fmt.Errorf("rowclient: table %s: key %d comes after key %d: held twice, or a part out of key order", t.Name, k, last)
		}
		last = t.Keys[r]
		split[dest[which[best]][r]].Append(*t, r)
	}
}

// LoadShard loads rows (ShardRows) onto the shard cl, initialised with
// the tables at generation gen, in LoadRows requests of at most maxBytes
// of rows (0: DefaultMaxRequestBytes), and then releases the row
// requests the shard held meanwhile.
func LoadShard(ctx context.Context, cl pb.ParameterServerClient, rows []shardckpt.TableRows, runID string, gen int64, maxBytes int) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRequestBytes
	}
	for _, r := range rows {
		if err := load(ctx, cl, r, runID, gen, maxBytes); err != nil {
			return fmt.Errorf("table %s: %w", r.Name, err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, loadRequestTimeout)
	defer cancel()
	if _, err := cl.LoadRows(rctx, &pb.LoadRowsRequest{RunId: runID, Generation: gen, Done: true}); err != nil {
		return fmt.Errorf("releasing the shard after its rows: %w", err)
	}
	return nil
}

// loadRequestTimeout bounds each LoadRows request: a load of any size
// goes on as long as each of its requests is answered in time.
const loadRequestTimeout = 30 * time.Second

// load sends a table's rows in requests of at most maxBytes.
func load(ctx context.Context, cl pb.ParameterServerClient, r shardckpt.TableRows, runID string, gen int64, maxBytes int) error {
	per := max(1, maxBytes/(8+4*(r.Dim+r.StateLen)))
	for lo := 0; lo < len(r.Keys); lo += per {
		hi := min(len(r.Keys), lo+per)
		rctx, cancel := context.WithTimeout(ctx, loadRequestTimeout)
		_, err := cl.LoadRows(rctx, &pb.LoadRowsRequest{RunId: runID, Generation: gen, Table: r.Name, Keys: r.Keys[lo:hi],
			Values: wire.Bytes(r.Values[lo*r.Dim : hi*r.Dim]), State: wire.Bytes(r.State[lo*r.StateLen : hi*r.StateLen])})
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}
