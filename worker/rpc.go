package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/internal/retry"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/compress"
	"github.com/pstrain/pstrain/transport/rowclient"
	"github.com/pstrain/pstrain/transport/wire"
)

// errNoGradients answers an early push the net had no gradients for.
var errNoGradients = errors.New("worker: the net has no gradients to push")

// pullOne is one pull of a round: it reads the parameters into the
// net's weights or leaves them where they arrive (the driver points the
// net at them, readShard), or says the pull was bounded and its bound
// passed first (Stalled).
func (w *Worker) pullOne(ctx context.Context, p PullOrder) *pulled {
	c := w.cfg
	s := p.Shard
	out := &pulled{ans: PullAnswer{Shard: s}}
	pctx := ctx
	if p.Bounded {
		var stop context.CancelFunc
		pctx, stop = context.WithTimeout(ctx, c.CatchUpAfter)
		defer stop()
	}
	t0 := time.Now()
	resp, err := w.pull(pctx, s, p.MinVersion, p.Generation)
	if err == nil {
		c.Metrics.ShardRPC.WithLabelValues("pull", strconv.Itoa(s)).Observe(time.Since(t0).Seconds())
	}
	if err != nil {
		// The data plane's deadline can fire a moment before the
		// context's: either says the bound passed.
		if p.Bounded && ctx.Err() == nil && (pctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded) {
			out.ans.Stalled = true
		} else {
			out.ans.Err = err
		}
		return out
	}
	bytes := 4 * c.Plan.Shards[s].Size
	switch {
	case resp.Params != nil && w.comp.pulls():
		bytes = len(resp.Params)
		if out.flat, err = w.comp.applyPull(s, resp.Params); err != nil {
			out.ans.Err = fmt.Errorf("shard %d (%s): compressed pull: %w", s, c.Shards[s].Addr, err)
			return out
		}
	case resp.Params != nil:
		if out.flat, err = wire.Floats(resp.Params); err != nil { // (pull checked the size against the plan)
			out.ans.Err = fmt.Errorf("shard %d (%s): %w", s, c.Shards[s].Addr, err)
			return out
		}
	}
	out.ans.Version, out.ans.Generation, out.ans.Done, out.ans.Position = resp.Version, resp.Generation, resp.Done, resp.DataPosition
	c.Metrics.RPCReceivedBytes.WithLabelValues("pull").Add(float64(bytes))
	w.wire.pulled(bytes)
	return out
}

func (w *Worker) pull(ctx context.Context, s int, minVersion, gen int64) (*pb.PullResponse, error) {
	var resp *pb.PullResponse
	err := w.retry(ctx, s, "pull", func() error {
		var err error
		req := &pb.PullRequest{Worker: int32(w.cfg.Index), MinVersion: minVersion, RunId: w.cfg.RunID, Generation: gen}
		cl := w.cfg.Shards[s].puller()
		vp, viewing := cl.(ViewingDataPlane)
		sp, segmented := cl.(SegmentedDataPlane)
		switch {
		case w.comp.pulls():
			// A delta from what the worker holds, into no segments: the
			// answer is not the parameters.
			req.Delta, req.DeltaBase = true, w.comp.rep[s].Base()
			resp, err = cl.Pull(ctx, req)
		case viewing && w.inPlace != nil && w.inPlace[s]:
			resp, err = vp.PullView(ctx, req, w.cfg.Plan.Segments(s, w.cfg.Net.Params()))
		case segmented:
			resp, err = sp.PullInto(ctx, req, w.cfg.Plan.Segments(s, w.cfg.Net.Params()))
		default:
			resp, err = cl.Pull(ctx, req)
		}
		if err == nil {
			err = w.sameLayout(s, resp)
		}
		if status.Code(err) == codes.Unavailable {
			// The shard may have restarted from an older checkpoint: after
			// an outage take whatever version it has.
			minVersion = 0
		}
		return err
	})
	return resp, err
}

// sameLayout refuses, as Unavailable so that the pull is retried, an
// answer of shard s whose size is not the worker's plan's: the shard
// serves another layout than the worker. That happens while a change of
// the PS count is under way and after one was undone (a shard lost
// around the switch is restored in the layout in effect;
// docs/elastic.md, "Parameter servers"). The chief's answer to the
// worker's next heartbeat brings the layout the shards serve, and the
// worker switches to it; until then it waits as for a shard that is
// down, within --connect-timeout.
func (w *Worker) sameLayout(s int, resp *pb.PullResponse) error {
	if resp.Params == nil {
		return nil // read into the net: its size was the plan's
	}
	got, known := len(resp.Params)/4, len(resp.Params)%4 == 0
	if w.comp.pulls() {
		// A shard of another layout has a new mirror for the worker, so
		// its first answer is whole.
		got, known = compress.WholeValues(resp.Params)
	}
	if want := w.cfg.Plan.Shards[s].Size; known && got != want {
		return status.Errorf(codes.Unavailable, "shard %d sent %d parameters, the worker's layout says %d: the layouts differ", s, got, want)
	}
	return nil
}

// pushOne pushes shard s its slice of grads as a says, after its share
// of rows (nil: none), and says what the shard did with it.
func (w *Worker) pushOne(ctx context.Context, s int, a Push, grads [][]float32, rows *rowclient.Staged) PushOutcome {
	c := w.cfg
	tag := a.Tags[s]
	req := &pb.PushRequest{Worker: int32(c.Index), Version: tag.Version, RunId: c.RunID, Loss: a.Loss, Generation: tag.Generation,
		DataPosition: a.DataPosition}
	var resp *pb.PushResponse
	push := func() (err error) { resp, err = c.Shards[s].Client.Push(ctx, req); return err }
	sp, segmented := c.Shards[s].Client.(SegmentedDataPlane)
	var segs [][]float32 // the gradient's segments, when pushed as they are
	bytes := 4 * c.Plan.Shards[s].Size
	switch {
	case w.comp.pushes():
		payload, err := w.comp.encode(s, tag.Generation, c.Plan.Segments(s, grads))
		if err != nil {
			return PushOutcome{Shard: s, Err: err}
		}
		req.Grad = payload
		bytes = len(payload)
	case w.half != nil:
		// Rounded straight from the model's gradients.
		off := 0
		for _, seg := range c.Plan.Segments(s, grads) {
			wire.PutBF16(w.half[s][off:], seg)
			off += 2 * len(seg)
		}
		req.Grad = w.half[s]
		bytes = len(w.half[s])
	case segmented:
		segs = c.Plan.Segments(s, grads)
		push = func() (err error) { resp, err = sp.PushSegments(ctx, req, segs); return err }
	default:
		c.Plan.Gather(s, grads, w.flat[s])
		req.Grad = wire.Bytes(w.flat[s])
	}
	if rows != nil && len(rows.Requests(s)) > 0 {
		var err error
		if push, err = w.pushAfterRows(ctx, s, rows, req, segs, &resp); err != nil {
			return PushOutcome{Shard: s, Err: err}
		}
	}
	t0 := time.Now()
	err := w.retry(ctx, s, "push", push)
	if err == nil {
		c.Metrics.ShardRPC.WithLabelValues("push", strconv.Itoa(s)).Observe(time.Since(t0).Seconds())
	}
	c.Metrics.RPCSentBytes.WithLabelValues("push").Add(float64(bytes))
	w.wire.pushed(bytes)
	out := PushOutcome{Shard: s, Err: err}
	if err == nil && resp != nil && resp.Outcome != pb.PushResponse_APPLIED {
		out.Result = PushDropped
	}
	return out
}

// pushAfterRows is a push of req (segs: its gradient's segments; nil:
// req.Grad) to shard s after the shard's share of rows, on one
// connection (RowsPusher): its answer goes into resp, the rows' answers
// to rows. An attempt sent again sends only the rows the shard has not
// taken (an async shard applies each it takes).
func (w *Worker) pushAfterRows(ctx context.Context, s int, rows *rowclient.Staged, req *pb.PushRequest, segs [][]float32, resp **pb.PushResponse) (func() error, error) {
	rp, ok := w.cfg.Shards[s].Client.(RowsPusher)
	if !ok {
		return nil, fmt.Errorf("shard %d (%s): its client cannot send the step's rows with its push", s, w.cfg.Shards[s].Addr)
	}
	reqs := rows.Requests(s)
	taken := make([]bool, len(reqs))
	return func() error {
		var send []*pb.PushRowsRequest
		var idx []int
		for i, r := range reqs {
			if !taken[i] {
				send, idx = append(send, r), append(idx, i)
			}
		}
		answers, r, err := rp.PushAfterRows(ctx, send, req, segs)
		for j, a := range answers {
			if a == nil {
				continue
			}
			taken[idx[j]] = true
			// (A row push answered done: so is the dense push after it.)
			if e := rows.Answered(s, idx[j], a); e != nil && !errors.Is(e, rowclient.ErrDone) && err == nil {
				err = e
			}
		}
		if err == nil {
			*resp = r
		}
		return err
	}, nil
}

// Located is a DataPlane that can say which process its calls go to
// now (a shard with a hot standby switches between two: NewFailover).
type Located interface {
	Where() string
}

// where names the process shard s's calls of op ("pull" or another) go
// to now: "ps/0 at ADDR", or what its client says (pulls have their own,
// Shard.Puller, which may have switched processes at another moment).
func (w *Worker) where(s int, op string) string {
	cl := w.cfg.Shards[s].Client
	if op == "pull" {
		cl = w.cfg.Shards[s].puller()
	}
	if l, ok := cl.(Located); ok {
		return l.Where()
	}
	return fmt.Sprintf("ps/%d at %s", s, w.cfg.Shards[s].Addr)
}

// retry calls f until it succeeds, fails with a non-retryable error, or
// the shard has been unavailable for RetryTimeout.
func (w *Worker) retry(ctx context.Context, s int, op string, f func() error) error {
	err := retry.Do(ctx, retry.Policy{First: 20 * time.Millisecond, Max: time.Second, Patience: w.cfg.RetryTimeout,
		Retryable: retry.OnCodes(codes.Unavailable),
		OnRetry: func(attempt int, err error) {
			if attempt == 1 {
				// (After a switch to a hot standby, the process retried.)
				w.cfg.Log.Warn("parameter server unavailable, retrying", "ps", s, "at", w.where(s, op), "op", op, "err", status.Convert(err).Message())
			}
			w.cfg.Metrics.Retries.Inc()
		}}, func(context.Context) error { return f() })
	var gaveUp *retry.GaveUpError
	switch {
	case err == nil || err == ctx.Err():
		return err
	case errors.As(err, &gaveUp):
		return fmt.Errorf("%s to %s: unavailable for %v, giving up: %w", op, w.where(s, op), gaveUp.After.Round(time.Millisecond), gaveUp.Err)
	}
	return fmt.Errorf("%s to %s: %w", op, w.where(s, op), err)
}
