package rowclient

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/ml/embed"
	pb "github.com/pstrain/pstrain/proto"
)

// fakeShard answers row calls only (the embedded client is nil): it
// counts the pushes it is sent, refuses the first refuse of them as
// unavailable, and answers a pull once pull returns.
type fakeShard struct {
	pb.ParameterServerClient
	pushes, refuse atomic.Int64
	pull           func(ctx context.Context) error
}

func (f *fakeShard) PushRows(ctx context.Context, req *pb.PushRowsRequest, _ ...grpc.CallOption) (*pb.PushRowsResponse, error) {
	f.pushes.Add(1)
	if f.refuse.Add(-1) >= 0 {
		return nil, status.Error(codes.Unavailable, "restarting")
	}
	return &pb.PushRowsResponse{}, nil
}

func (f *fakeShard) PullRows(ctx context.Context, req *pb.PullRowsRequest, _ ...grpc.CallOption) (*pb.PullRowsResponse, error) {
	if err := f.pull(ctx); err != nil {
		return nil, err
	}
	b := req.Tables[0]
	n := len(b.Keys) + len(b.SmallKeys)
	return &pb.PullRowsResponse{Tables: []*pb.RowBlock{{Table: b.Table, Values: make([]byte, 4*n)}}}, nil
}

// keysOnEvery returns keys of table that fall on each of n shards.
func keysOnEvery(table string, n int) []uint64 {
	var keys []uint64
	seen := map[int]bool{}
	for k := uint64(1); len(seen) < n; k++ {
		seen[embed.ShardOf(table, k, n)] = true
		keys = append(keys, k)
	}
	return keys
}

// retryUnavailable retries an unavailable request at once, up to 10
// times.
func retryUnavailable(ctx context.Context, call func(context.Context) error) error {
	var err error
	for range 10 {
		if err = call(ctx); status.Code(err) != codes.Unavailable {
			return err
		}
	}
	return err
}

// TestPushRetriesOnlyTheShardThatRefused: a push one shard refuses as
// unavailable is sent again to that shard only; the others, which took
// their share, are not sent it twice (an async shard would apply it
// twice).
func TestPushRetriesOnlyTheShardThatRefused(t *testing.T) {
	shards := []*fakeShard{{}, {}}
	shards[1].refuse.Store(1)
	c, err := New(Config{Shards: shardsOf([]pb.ParameterServerClient{shards[0], shards[1]}), RunID: "r", Worker: 0, Retry: retryUnavailable})
	if err != nil {
		t.Fatal(err)
	}
	keys := keysOnEvery("emb/C1", 2)
	if err := c.Push(context.Background(), 1, "emb/C1", keys, make([]float32, len(keys))); err != nil {
		t.Fatal(err)
	}
	if p0, p1 := shards[0].pushes.Load(), shards[1].pushes.Load(); p0 != 1 || p1 != 2 {
		t.Errorf("shard 0 was sent %d pushes, shard 1 %d; want 1 and 2 (its refused one again)", p0, p1)
	}
}

// TestFailedShardCancelsTheOthers: when one shard's request fails, the
// requests still waiting on the other shards are cancelled at once (a
// sync pull can wait long for a shard's version) and the call returns
// the failure.
func TestFailedShardCancelsTheOthers(t *testing.T) {
	refused := status.Error(codes.InvalidArgument, "refused")
	ended := make(chan error, 1)
	shards := []*fakeShard{
		{pull: func(context.Context) error { return refused }},
		{pull: func(ctx context.Context) error {
			<-ctx.Done()
			ended <- ctx.Err()
			return status.FromContextError(ctx.Err()).Err()
		}},
	}
	c, err := New(Config{Shards: shardsOf([]pb.ParameterServerClient{shards[0], shards[1]}), RunID: "r", Worker: 0})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys := keysOnEvery("emb/C1", 2)
	err = c.Pull(ctx, 1, "emb/C1", keys, make([]float32, len(keys)))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("pull: %v, want shard 0's refusal", err)
	}
	if sib := <-ended; !errors.Is(sib, context.Canceled) {
		t.Errorf("shard 1's request ended with %v, want cancelled by shard 0's failure (not the caller's deadline)", sib)
	}
}
