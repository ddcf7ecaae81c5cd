package rowclient

import (
	"context"
	"fmt"
	"slices"
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

// SplitRows splits tables' rows (ReadTables of every row) among n
// shards by embed.ShardOf: out[s] is what ShardRows(ck, s, n) reads, in
// one pass over the rows (and one to count them, so that each shard's
// arrays are allocated once).
func SplitRows(tables []shardckpt.TableRows, n int) [][]shardckpt.TableRows {
	out := make([][]shardckpt.TableRows, n)
	shard := []int(nil)
	for _, t := range tables {
		p := embed.PlacerOf(t.Name, n)
		shard = slices.Grow(shard[:0], len(t.Keys))[:len(t.Keys)]
		count := make([]int, n)
		for i, k := range t.Keys {
			shard[i] = p.Shard(k)
			count[shard[i]]++
		}
		parts := make([]shardckpt.TableRows, n)
		for s := range parts {
			parts[s] = shardckpt.TableRows{Name: t.Name, Kind: t.Kind, Dim: t.Dim, StateLen: t.StateLen,
				Keys: make([]uint64, 0, count[s]), Values: make([]float32, 0, count[s]*t.Dim), State: make([]float32, 0, count[s]*t.StateLen)}
		}
		for i, k := range t.Keys {
			d := &parts[shard[i]]
			d.Keys = append(d.Keys, k)
			d.Values = append(d.Values, t.Values[i*t.Dim:(i+1)*t.Dim]...)
			d.State = append(d.State, t.State[i*t.StateLen:(i+1)*t.StateLen]...)
		}
		for s := range parts {
			out[s] = append(out[s], parts[s])
		}
	}
	return out
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
