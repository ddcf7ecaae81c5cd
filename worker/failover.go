package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/rowclient"
)

// Process is one of a shard's two PS processes (--ps-replicas 1): its
// task name, its address and the worker's client of it.
type Process struct {
	Task   string // "ps/0", "standby/0"
	Addr   string
	Client DataPlane
	// Role asks the process its replication role (Status.role: "primary",
	// "standby", "deposed" or ""); nil: it is never asked, and a call to
	// a frozen process waits for it to wake or its context to end.
	Role func(ctx context.Context) (string, error)
}

// A call that has not returned after slowCall asks the shard's other
// process, every slowCall, whether it is now the primary: a frozen
// process neither answers nor refuses, so being refused cannot tell the
// worker of its successor (docs/replication.md, "A frozen primary"). A
// sync pull waiting at the barrier is slow too; its other process then
// answers "standby" and nothing changes.
const slowCall = 250 * time.Millisecond

// errSuperseded cancels a call whose process's peer was promoted.
var errSuperseded = errors.New("the shard's other process serves as its primary now")

// failover is the DataPlane of a shard with a hot standby: it holds the
// clients of both processes and sends every call to the current one.
// Which process is the shard's primary is the chief's call
// (docs/replication.md); a worker learns it by being refused: a process
// that is down, or a standby or deposed primary, answers
// codes.Unavailable. On that error failover makes the other process the
// current one before returning the error, so the worker's retry loop
// (which retries Unavailable) sends the retry there. A frozen process
// refuses nothing; a call to it is abandoned as Unavailable once the
// other process says it is the primary (call, slowCall).
type failover struct {
	shard int
	procs [2]Process
	log   *slog.Logger
	cur   *atomic.Int32 // the index in procs calls go to (shared by a pair: NewFailoverPair)
}

// NewFailover is the DataPlane of shard whose processes are first (the
// current one at the start: ps/N, the primary the chief starts with) and
// second. It is a SegmentedDataPlane when both clients are.
func NewFailover(shard int, first, second Process, log *slog.Logger) DataPlane {
	return newFailover(shard, first, second, new(atomic.Int32), log)
}

// NewFailoverPair is two DataPlanes of shard that switch processes
// together: push goes through first's and second's Client, pull through
// their clients firstPull and secondPull (Shard.Puller). A switch either
// learns of moves both, so a shard's pushes and pulls never go to
// different processes for longer than a call under way.
func NewFailoverPair(shard int, first, second Process, firstPull, secondPull DataPlane, log *slog.Logger) (push, pull DataPlane) {
	cur := new(atomic.Int32)
	fp, sp := first, second
	fp.Client, sp.Client = firstPull, secondPull
	return newFailover(shard, first, second, cur, log), newFailover(shard, fp, sp, cur, log)
}

func newFailover(shard int, first, second Process, cur *atomic.Int32, log *slog.Logger) DataPlane {
	f := &failover{shard: shard, procs: [2]Process{first, second}, log: log, cur: cur}
	_, s1 := first.Client.(SegmentedDataPlane)
	_, s2 := second.Client.(SegmentedDataPlane)
	if s1 && s2 {
		return segmentedFailover{f}
	}
	return f
}

// Where names the process calls go to now, "standby/0 at ADDR" (the
// worker's logs and errors say it: Located).
func (f *failover) Where() string {
	p := f.procs[f.cur.Load()]
	return p.Task + " at " + p.Addr
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

// call sends one call to the current process. While it is under way
// past slowCall, the other process is asked whether it is the primary
// now; if so the call is abandoned as Unavailable (so the retry loop
// sends it again, to that process: a push that did count is then a
// duplicate, docs/replication.md).
func call[T any](ctx context.Context, f *failover, send func(context.Context, DataPlane) (T, error)) (T, error) {
	return callOn(ctx, f, func(ctx context.Context, i int32) (T, error) { return send(ctx, f.procs[i].Client) })
}

// callOn is call of a send that takes the index of the process to call.
func callOn[T any](ctx context.Context, f *failover, send func(context.Context, int32) (T, error)) (T, error) {
	i := f.cur.Load()
	other := f.procs[1-i]
	if other.Role == nil {
		resp, err := send(ctx, i)
		return resp, f.done(i, err)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watch := time.AfterFunc(slowCall, func() { f.watch(cctx, other, cancel) })
	defer watch.Stop()
	resp, err := send(cctx, i)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(cctx), errSuperseded) {
		err = status.Errorf(codes.Unavailable, "%s did not answer and %s serves as shard %d's primary now", f.procs[i].Task, other.Task, f.shard)
	}
	return resp, f.done(i, err)
}

// watch asks other, every slowCall until ctx ends, whether it is the
// primary; if so it cancels the call with errSuperseded.
func (f *failover) watch(ctx context.Context, other Process, cancel context.CancelCauseFunc) {
	t := time.NewTicker(slowCall)
	defer t.Stop()
	for {
		actx, done := context.WithTimeout(ctx, slowCall)
		role, err := other.Role(actx)
		done()
		if err == nil && role == rolePrimary {
			cancel(errSuperseded)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// rolePrimary is Status.role of a shard's primary.
const rolePrimary = "primary"

func (f *failover) Pull(ctx context.Context, in *pb.PullRequest, opts ...grpc.CallOption) (*pb.PullResponse, error) {
	return call(ctx, f, func(ctx context.Context, c DataPlane) (*pb.PullResponse, error) { return c.Pull(ctx, in, opts...) })
}

func (f *failover) Push(ctx context.Context, in *pb.PushRequest, opts ...grpc.CallOption) (*pb.PushResponse, error) {
	return call(ctx, f, func(ctx context.Context, c DataPlane) (*pb.PushResponse, error) { return c.Push(ctx, in, opts...) })
}

// segmentedFailover is a failover whose clients are both
// SegmentedDataPlanes.
type segmentedFailover struct{ *failover }

func (f segmentedFailover) PullInto(ctx context.Context, in *pb.PullRequest, dst [][]float32) (*pb.PullResponse, error) {
	return call(ctx, f.failover, func(ctx context.Context, c DataPlane) (*pb.PullResponse, error) {
		return c.(SegmentedDataPlane).PullInto(ctx, in, dst)
	})
}

// PullView is the current client's PullView, or its PullInto if it has
// none.
func (f segmentedFailover) PullView(ctx context.Context, in *pb.PullRequest, dst [][]float32) (*pb.PullResponse, error) {
	return call(ctx, f.failover, func(ctx context.Context, c DataPlane) (*pb.PullResponse, error) {
		if v, ok := c.(ViewingDataPlane); ok {
			return v.PullView(ctx, in, dst)
		}
		return c.(SegmentedDataPlane).PullInto(ctx, in, dst)
	})
}

func (f segmentedFailover) PushSegments(ctx context.Context, in *pb.PushRequest, segs [][]float32) (*pb.PushResponse, error) {
	return call(ctx, f.failover, func(ctx context.Context, c DataPlane) (*pb.PushResponse, error) {
		return c.(SegmentedDataPlane).PushSegments(ctx, in, segs)
	})
}

// PushAfterRows is the current client's PushAfterRows (RowsPusher);
// Unimplemented if it has none.
func (f segmentedFailover) PushAfterRows(ctx context.Context, rows []*pb.PushRowsRequest, in *pb.PushRequest, segs [][]float32) ([]*pb.PushRowsResponse, *pb.PushResponse, error) {
	type answers struct {
		rows []*pb.PushRowsResponse
		push *pb.PushResponse
	}
	a, err := call(ctx, f.failover, func(ctx context.Context, c DataPlane) (answers, error) {
		rp, ok := c.(RowsPusher)
		if !ok {
			return answers{}, status.Errorf(codes.Unimplemented, "%T cannot send rows with a push", c)
		}
		r, p, err := rp.PushAfterRows(ctx, rows, in, segs)
		return answers{r, p}, err
	})
	return a.rows, a.push, err
}

// NewRowFailover is the row client (rowclient.Shard) of shard with a hot
// standby: rows[i] is the row client of procs' process i (their Client
// is not used). It switches processes as the dense failover does, on
// its own: a switch one of them learns of the other learns at its next
// call. It is a rowclient.Placer when both row clients are.
func NewRowFailover(shard int, first, second Process, rows [2]rowclient.Shard, log *slog.Logger) rowclient.Shard {
	f := rowFailover{f: &failover{shard: shard, procs: [2]Process{first, second}, log: log, cur: new(atomic.Int32)}, rows: rows}
	_, p1 := rows[0].(rowclient.Placer)
	_, p2 := rows[1].(rowclient.Placer)
	if p1 && p2 {
		return placingRowFailover{f}
	}
	return f
}

// rowFailover is NewRowFailover's client.
type rowFailover struct {
	f    *failover
	rows [2]rowclient.Shard
}

func (r rowFailover) PullRows(ctx context.Context, in *pb.PullRowsRequest, opts ...grpc.CallOption) (*pb.PullRowsResponse, error) {
	return callOn(ctx, r.f, func(ctx context.Context, i int32) (*pb.PullRowsResponse, error) {
		return r.rows[i].PullRows(ctx, in, opts...)
	})
}

func (r rowFailover) PushRows(ctx context.Context, in *pb.PushRowsRequest, opts ...grpc.CallOption) (*pb.PushRowsResponse, error) {
	return callOn(ctx, r.f, func(ctx context.Context, i int32) (*pb.PushRowsResponse, error) {
		return r.rows[i].PushRows(ctx, in, opts...)
	})
}

// placingRowFailover is a rowFailover whose row clients are both
// rowclient.Placers.
type placingRowFailover struct{ rowFailover }

func (r placingRowFailover) PullRowsPlaced(ctx context.Context, in *pb.PullRowsRequest, place func(*pb.PullRowsResponse) error) error {
	_, err := callOn(ctx, r.f, func(ctx context.Context, i int32) (struct{}, error) {
		return struct{}{}, r.rows[i].(rowclient.Placer).PullRowsPlaced(ctx, in, place)
	})
	return err
}
