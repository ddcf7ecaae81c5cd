package rowclient

import (
	"context"
	"fmt"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/ml/embed"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// Restore loads a checkpoint's embedding rows, with their optimizer
// state, onto shards (the chief's clients of every shard, initialised
// with the tables at generation gen): each row goes to the shard
// embed.ShardOf gives it among len(shards), however many shards wrote
// the checkpoint. It reads the checkpoint once per shard and holds one
// shard's rows at a time; LoadRows requests carry at most maxBytes of
// rows (0: DefaultMaxRequestBytes).
func Restore(ctx context.Context, ck *checkpoint.Checkpoint, shards []pb.ParameterServerClient, runID string, gen int64, maxBytes int) error {
	all := make([]int, len(shards))
	for s := range all {
		all[s] = s
	}
	return RestoreShards(ctx, ck, shards, all, runID, gen, maxBytes)
}

// RestoreShards is Restore onto the shards listed in targets only (the
// others keep their rows): what a restore of some shards needs.
func RestoreShards(ctx context.Context, ck *checkpoint.Checkpoint, shards []pb.ParameterServerClient, targets []int, runID string, gen int64, maxBytes int) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRequestBytes
	}
	n := len(shards)
	for _, s := range targets {
		if s < 0 || s >= n {
			return fmt.Errorf("rowclient: restoring shard %d of %d", s, n)
		}
		cl := shards[s]
		tables, err := shardckpt.ReadTables(ck, func(table string, k uint64) bool { return embed.ShardOf(table, k, n) == s })
		if err != nil {
			return err
		}
		for _, r := range tables {
			if err := load(ctx, cl, r, runID, gen, maxBytes); err != nil {
				return fmt.Errorf("rowclient: restoring %s onto shard %d of %d: %w", r.Name, s, n, err)
			}
		}
		if _, err := cl.LoadRows(ctx, &pb.LoadRowsRequest{RunId: runID, Generation: gen, Done: true}); err != nil {
			return fmt.Errorf("rowclient: releasing shard %d of %d after its rows: %w", s, n, err)
		}
	}
	return nil
}

// load sends a table's rows in requests of at most maxBytes.
func load(ctx context.Context, cl pb.ParameterServerClient, r shardckpt.TableRows, runID string, gen int64, maxBytes int) error {
	per := max(1, maxBytes/(8+4*(r.Dim+r.StateLen)))
	for lo := 0; lo < len(r.Keys); lo += per {
		hi := min(len(r.Keys), lo+per)
		_, err := cl.LoadRows(ctx, &pb.LoadRowsRequest{RunId: runID, Generation: gen, Table: r.Name, Keys: r.Keys[lo:hi],
			Values: wire.Bytes(r.Values[lo*r.Dim : hi*r.Dim]), State: wire.Bytes(r.State[lo*r.StateLen : hi*r.StateLen])})
		if err != nil {
			return err
		}
	}
	return nil
}
