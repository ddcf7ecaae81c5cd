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

// LoadShard loads rows (ShardRows) onto the shard cl, initialised with
// the tables at generation gen, in LoadRows requests of at most maxBytes
// of rows (0: DefaultMaxRequestBytes), and then releases the row
// requests the shard held meanwhile. Each request says how many rows of
// its table are still to come (a table may come in several parts), so
// that the shard makes room for them at once.
func LoadShard(ctx context.Context, cl pb.ParameterServerClient, rows []shardckpt.TableRows, runID string, gen int64, maxBytes int) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRequestBytes
	}
	toCome := map[string]int{}
	for _, r := range rows {
		toCome[r.Name] += len(r.Keys)
	}
	for _, r := range rows {
		if err := load(ctx, cl, r, runID, gen, maxBytes, toCome); err != nil {
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

// load sends a table's rows in requests of at most maxBytes; toCome
// counts each table's rows not sent yet, which it takes r's from.
func load(ctx context.Context, cl pb.ParameterServerClient, r shardckpt.TableRows, runID string, gen int64, maxBytes int, toCome map[string]int) error {
	per := max(1, maxBytes/(8+4*(r.Dim+r.StateLen)))
	for lo := 0; lo < len(r.Keys); lo += per {
		hi := min(len(r.Keys), lo+per)
		rctx, cancel := context.WithTimeout(ctx, loadRequestTimeout)
		_, err := cl.LoadRows(rctx, &pb.LoadRowsRequest{RunId: runID, Generation: gen, Table: r.Name, Keys: r.Keys[lo:hi],
			Values: wire.Bytes(r.Values[lo*r.Dim : hi*r.Dim]), State: wire.Bytes(r.State[lo*r.StateLen : hi*r.StateLen]),
			RowsToCome: int64(toCome[r.Name])})
		cancel()
		if err != nil {
			return err
		}
		toCome[r.Name] -= hi - lo
	}
	return nil
}
