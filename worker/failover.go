package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
)

// Process is one of a shard's two PS processes (--ps-replicas 1): its
// task name, its address and the worker's client of it.
type Process struct {
	Task   string // "ps/0", "standby/0"
	Addr   string
	Client DataPlane
}

// failover is the DataPlane of a shard with a hot standby: it holds the
// clients of both processes and sends every call to the current one.
// Which process is the shard's primary is the chief's call
// (docs/replication.md); a worker learns it by being refused: a process
// that is down, or a standby or deposed primary, answers
// codes.Unavailable. On that error failover makes the other process the
// current one before returning the error, so the worker's retry loop
// (which retries Unavailable) sends the retry there.
type failover struct {
	shard int
	procs [2]Process
	log   *slog.Logger
	cur   atomic.Int32 // the index in procs calls go to
}

// NewFailover is the DataPlane of shard whose processes are first (the
// current one at the start: ps/N, the primary the chief starts with) and
// second. It is a SegmentedDataPlane when both clients are.
func NewFailover(shard int, first, second Process, log *slog.Logger) DataPlane {
	f := &failover{shard: shard, procs: [2]Process{first, second}, log: log}
	_, s1 := first.Client.(SegmentedDataPlane)
	_, s2 := second.Client.(SegmentedDataPlane)
	if s1 && s2 {
		return segmentedFailover{f}
	}
	return f
}

// current is the index and client calls go to now.
func (f *failover) current() (int32, DataPlane) {
	i := f.cur.Load()
	return i, f.procs[i].Client
}

// done notes the outcome of a call sent to process i: on Unavailable the
// other process becomes the current one, unless a concurrent call has
// switched already (the switch is logged once). err is returned as is.
func (f *failover) done(i int32, err error) error {
	if status.Code(err) != codes.Unavailable {
		return err
	}
	if f.cur.CompareAndSwap(i, 1-i) {
		from, to := f.procs[i], f.procs[1-i]
		f.log.Warn(fmt.Sprintf("switching to the other process of shard %d", f.shard), "shard", f.shard, "from", from.Task, "to", to.Task, "addr", to.Addr,
			"err", status.Convert(err).Message())
	}
	return err
}

func (f *failover) Pull(ctx context.Context, in *pb.PullRequest, opts ...grpc.CallOption) (*pb.PullResponse, error) {
	i, c := f.current()
	resp, err := c.Pull(ctx, in, opts...)
	return resp, f.done(i, err)
}

func (f *failover) Push(ctx context.Context, in *pb.PushRequest, opts ...grpc.CallOption) (*pb.PushResponse, error) {
	i, c := f.current()
	resp, err := c.Push(ctx, in, opts...)
	return resp, f.done(i, err)
}

// segmentedFailover is a failover whose clients are both
// SegmentedDataPlanes.
type segmentedFailover struct{ *failover }

func (f segmentedFailover) PullInto(ctx context.Context, in *pb.PullRequest, dst [][]float32) (*pb.PullResponse, error) {
	i, c := f.current()
	resp, err := c.(SegmentedDataPlane).PullInto(ctx, in, dst)
	return resp, f.done(i, err)
}

func (f segmentedFailover) PushSegments(ctx context.Context, in *pb.PushRequest, segs [][]float32) (*pb.PushResponse, error) {
	i, c := f.current()
	resp, err := c.(SegmentedDataPlane).PushSegments(ctx, in, segs)
	return resp, f.done(i, err)
}
