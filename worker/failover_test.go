package worker_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/syncbuf"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/worker"
)

// fakeProc is one PS process as a worker sees it: every call is counted
// and answered by answer (nil: success).
type fakeProc struct {
	name   string
	calls  atomic.Int64
	answer func() error
}

func (f *fakeProc) call() error {
	f.calls.Add(1)
	if f.answer == nil {
		return nil
	}
	return f.answer()
}

func (f *fakeProc) Pull(context.Context, *pb.PullRequest, ...grpc.CallOption) (*pb.PullResponse, error) {
	if err := f.call(); err != nil {
		return nil, err
	}
	return &pb.PullResponse{Version: 7}, nil
}

func (f *fakeProc) Push(context.Context, *pb.PushRequest, ...grpc.CallOption) (*pb.PushResponse, error) {
	return &pb.PushResponse{}, f.call()
}

// segmentedProc is a fakeProc that also pulls into and pushes from
// segments, as dataplane.Client does.
type segmentedProc struct{ *fakeProc }

func (s segmentedProc) PullInto(ctx context.Context, in *pb.PullRequest, _ [][]float32) (*pb.PullResponse, error) {
	return s.Pull(ctx, in)
}

func (s segmentedProc) PushSegments(ctx context.Context, in *pb.PushRequest, _ [][]float32) (*pb.PushResponse, error) {
	return s.Push(ctx, in)
}

// viewingProc is a segmentedProc that can also leave a pull in place
// (worker.ViewingDataPlane); its PullView answers Version 8, to tell it
// from PullInto's 7.
type viewingProc struct{ segmentedProc }

func (v viewingProc) PullView(ctx context.Context, in *pb.PullRequest, _ [][]float32) (*pb.PullResponse, error) {
	if err := v.call(); err != nil {
		return nil, err
	}
	return &pb.PullResponse{Version: 8}, nil
}

// switches counts the switch lines for shard 3 in a log.
func switches(logs *syncbuf.Buffer) int {
	return strings.Count(logs.String(), "switching to the other process of shard 3")
}

func unavailable() error {
	return status.Error(codes.Unavailable, "ps: shard 3 here is a standby: its primary serves workers")
}

func TestFailoverSwitchesOnUnavailable(t *testing.T) {
	var logs syncbuf.Buffer
	down := true
	ps := &fakeProc{name: "ps/3", answer: func() error {
		if down {
			return unavailable()
		}
		return nil
	}}
	sb := &fakeProc{name: "standby/3"}
	dp := worker.NewFailover(3, worker.Process{Task: "ps/3", Addr: "a:1", Client: ps}, worker.Process{Task: "standby/3", Addr: "b:1", Client: sb},
		slog.New(slog.NewTextHandler(&logs, nil)))
	ctx := context.Background()
	// The first call goes to ps/3, fails Unavailable, and is returned as
	// such (for the worker's retry loop); the retry goes to standby/3.
	if _, err := dp.Push(ctx, &pb.PushRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("first push: %v, want the Unavailable error itself", err)
	}
	if resp, err := dp.Pull(ctx, &pb.PullRequest{}); err != nil || resp.Version != 7 {
		t.Fatalf("pull after the switch: %v, %v", resp, err)
	}
	if _, err := dp.Push(ctx, &pb.PushRequest{}); err != nil {
		t.Fatal(err)
	}
	if ps.calls.Load() != 1 || sb.calls.Load() != 2 {
		t.Fatalf("calls: ps/3 %d, standby/3 %d; want 1 and 2", ps.calls.Load(), sb.calls.Load())
	}
	if n := switches(&logs); n != 1 {
		t.Fatalf("%d switch lines, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "to=standby/3") {
		t.Fatalf("the switch line does not name the new process:\n%s", logs.String())
	}
	// The worker's retry lines and errors name the process calls go to.
	if w := dp.(worker.Located).Where(); w != "standby/3 at b:1" {
		t.Fatalf("Where() = %q after the switch, want standby/3 at b:1", w)
	}
	// standby/3 dies in turn (its primary came back as ps/3): back.
	down = false
	sb.answer = func() error { return unavailable() }
	if _, err := dp.Pull(ctx, &pb.PullRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("pull from the dead standby: %v", err)
	}
	if _, err := dp.Pull(ctx, &pb.PullRequest{}); err != nil || ps.calls.Load() != 2 {
		t.Fatalf("pull after switching back: %v (ps/3 calls %d)", err, ps.calls.Load())
	}
	if n := switches(&logs); n != 2 {
		t.Fatalf("%d switch lines after switching back, want 2", n)
	}
}

// A pair's pushes and pulls (NewFailoverPair: a shard's Client and
// Puller) switch processes together: the push that is refused moves the
// pulls too, which never reach the refusing process, and the switch is
// logged once.
func TestFailoverPairSwitchesTogether(t *testing.T) {
	var logs syncbuf.Buffer
	ps := &fakeProc{name: "ps/3", answer: unavailable}
	psPull := &fakeProc{name: "ps/3 pulls"}
	sb, sbPull := &fakeProc{name: "standby/3"}, &fakeProc{name: "standby/3 pulls"}
	push, pull := worker.NewFailoverPair(3, worker.Process{Task: "ps/3", Addr: "a:1", Client: ps},
		worker.Process{Task: "standby/3", Addr: "b:1", Client: sb}, psPull, sbPull, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx := context.Background()
	if _, err := push.Push(ctx, &pb.PushRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("push to the dead primary: %v, want Unavailable", err)
	}
	if _, err := pull.Pull(ctx, &pb.PullRequest{}); err != nil {
		t.Fatal(err)
	}
	if psPull.calls.Load() != 0 || sbPull.calls.Load() != 1 {
		t.Fatalf("pulls: ps/3 %d, standby/3 %d; want 0 and 1 (the pull side switched with the push side)", psPull.calls.Load(), sbPull.calls.Load())
	}
	if w := pull.(worker.Located).Where(); w != "standby/3 at b:1" {
		t.Fatalf("the pull side's Where() = %q, want standby/3 at b:1", w)
	}
	if n := switches(&logs); n != 1 {
		t.Fatalf("%d switch lines, want 1:\n%s", n, logs.String())
	}
}

func TestFailoverKeepsProcessOnOtherErrors(t *testing.T) {
	var logs syncbuf.Buffer
	refused := status.Error(codes.InvalidArgument, "bad gradient")
	ps := &fakeProc{answer: func() error { return refused }}
	sb := &fakeProc{}
	dp := worker.NewFailover(3, worker.Process{Task: "ps/3", Client: ps}, worker.Process{Task: "standby/3", Client: sb},
		slog.New(slog.NewTextHandler(&logs, nil)))
	for range 3 {
		if _, err := dp.Push(context.Background(), &pb.PushRequest{}); !errors.Is(err, refused) {
			t.Fatalf("push: %v, want %v", err, refused)
		}
	}
	if ps.calls.Load() != 3 || sb.calls.Load() != 0 || switches(&logs) != 0 {
		t.Fatalf("calls ps/3 %d standby/3 %d, switches %d: a non-Unavailable error must not switch", ps.calls.Load(), sb.calls.Load(), switches(&logs))
	}
}

// Calls in flight together that all fail on the old process switch once,
// not back and forth.
func TestFailoverSwitchesOnceForConcurrentFailures(t *testing.T) {
	const n = 8
	var logs syncbuf.Buffer
	var arrived sync.WaitGroup
	arrived.Add(n)
	ps := &fakeProc{answer: func() error {
		arrived.Done()
		arrived.Wait() // every call is in flight at the old process
		return unavailable()
	}}
	sb := &fakeProc{}
	dp := worker.NewFailover(3, worker.Process{Task: "ps/3", Client: ps}, worker.Process{Task: "standby/3", Client: sb},
		slog.New(slog.NewTextHandler(&logs, nil)))
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dp.Pull(context.Background(), &pb.PullRequest{})
		}()
	}
	wg.Wait()
	if _, err := dp.Push(context.Background(), &pb.PushRequest{}); err != nil || sb.calls.Load() != 1 {
		t.Fatalf("after the failures: %v, standby/3 calls %d", err, sb.calls.Load())
	}
	if s := switches(&logs); s != 1 {
		t.Fatalf("%d switch lines for %d concurrent failures, want 1", s, n)
	}
}

func TestFailoverIsSegmentedWhenBothAre(t *testing.T) {
	log := quietLog()
	ps, sb := &fakeProc{answer: unavailable}, &fakeProc{}
	dp := worker.NewFailover(0, worker.Process{Task: "ps/0", Client: segmentedProc{ps}}, worker.Process{Task: "standby/0", Client: segmentedProc{sb}}, log)
	sp, ok := dp.(worker.SegmentedDataPlane)
	if !ok {
		t.Fatal("two segmented clients: the failover is not a SegmentedDataPlane")
	}
	if _, err := sp.PushSegments(context.Background(), &pb.PushRequest{}, nil); status.Code(err) != codes.Unavailable {
		t.Fatalf("PushSegments: %v", err)
	}
	if _, err := sp.PullInto(context.Background(), &pb.PullRequest{}, nil); err != nil || sb.calls.Load() != 1 {
		t.Fatalf("PullInto after the switch: %v, standby/0 calls %d", err, sb.calls.Load())
	}
	mixed := worker.NewFailover(0, worker.Process{Task: "ps/0", Client: segmentedProc{ps}}, worker.Process{Task: "standby/0", Client: sb}, log)
	if _, ok := mixed.(worker.SegmentedDataPlane); ok {
		t.Fatal("one plain client: the failover claims to be segmented")
	}
	// PullView goes to the serving process's PullView (after a refusal
	// made it switch), or its PullInto if it has none.
	vp, vs := &fakeProc{answer: unavailable}, &fakeProc{}
	for _, c := range []struct {
		standby worker.DataPlane
		want    int64
	}{{viewingProc{segmentedProc{vs}}, 8}, {segmentedProc{vs}, 7}} {
		dp := worker.NewFailover(0, worker.Process{Task: "ps/0", Client: viewingProc{segmentedProc{vp}}}, worker.Process{Task: "standby/0", Client: c.standby}, log)
		v, ok := dp.(worker.ViewingDataPlane)
		if !ok {
			t.Fatal("two segmented clients: the failover has no PullView")
		}
		if _, err := v.PullView(context.Background(), &pb.PullRequest{}, nil); status.Code(err) != codes.Unavailable {
			t.Fatalf("PullView to ps/0: %v", err)
		}
		resp, err := v.PullView(context.Background(), &pb.PullRequest{}, nil)
		if err != nil || resp.Version != c.want {
			t.Fatalf("PullView after the switch: %v, %v; want the standby's answer to version %d", resp, err, c.want)
		}
	}
}

// A worker whose shard 0 starts on a process that refuses it (a standby:
// codes.Unavailable) trains to the end: its retry loop retries, and the
// failover sends the retry to the shard's serving process.
func TestWorkerTrainsThroughFailover(t *testing.T) {
	for _, plane := range []config.DataPlane{config.GRPC, config.TCP} {
		t.Run(string(plane), func(t *testing.T) {
			spec := model.Spec{Input: 16, Hidden: []int{8}, Classes: 3}
			run := config.Default()
			run.LRSchedule = "constant"
			run.Mode, run.PS, run.Workers, run.Batch, run.Hidden, run.LR, run.DataPlane = config.Async, 2, 1, 16, spec.Hidden, 0.05, plane
			data := testcluster.Synthetic(300, spec.Input, spec.Classes, 5)
			const total = 40
			c := startCluster(t, run, spec, total)
			var logs syncbuf.Buffer
			standby := &fakeProc{answer: func() error {
				return status.Error(codes.Unavailable, "ps: shard 0 here is a standby: its primary serves workers")
			}}
			var segmented bool
			startWorker(t, c, context.Background(), 0, countingSource(data, run.Batch, 0), func(cfg *worker.Config) {
				real := cfg.Shards[0].Client
				var first worker.DataPlane = standby
				if _, ok := real.(worker.SegmentedDataPlane); ok {
					first = segmentedProc{standby}
				}
				cfg.Shards[0].Client = worker.NewFailover(0, worker.Process{Task: "standby/0", Client: first},
					worker.Process{Task: "ps/0", Addr: cfg.Shards[0].Addr, Client: real}, slog.New(slog.NewTextHandler(&logs, nil)))
				_, segmented = cfg.Shards[0].Client.(worker.SegmentedDataPlane)
			})
			waitAll(t, c)
			if st, _ := c.PS(0).Status(); st.Version != total {
				t.Fatalf("shard 0 at version %d, want %d", st.Version, total)
			}
			if standby.calls.Load() != 1 {
				t.Fatalf("the standby was called %d times, want once (then the failover stays on the primary)", standby.calls.Load())
			}
			if n := strings.Count(logs.String(), "switching to the other process of shard 0"); n != 1 {
				t.Fatalf("%d switch lines, want 1:\n%s", n, logs.String())
			}
			if want := plane == config.TCP; segmented != want {
				t.Fatalf("segmented failover = %v on %s", segmented, plane)
			}
		})
	}
}

// frozenProc is a PS process that stopped without dying: a call waits
// until its context ends (or until thaw is closed: it answers then).
type frozenProc struct {
	thaw  chan struct{}
	calls atomic.Int64
}

func (f *frozenProc) wait(ctx context.Context) error {
	f.calls.Add(1)
	select {
	case <-f.thaw:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (f *frozenProc) Pull(ctx context.Context, _ *pb.PullRequest, _ ...grpc.CallOption) (*pb.PullResponse, error) {
	if err := f.wait(ctx); err != nil {
		return nil, err
	}
	return &pb.PullResponse{Version: 9}, nil
}

func (f *frozenProc) Push(ctx context.Context, _ *pb.PushRequest, _ ...grpc.CallOption) (*pb.PushResponse, error) {
	return &pb.PushResponse{}, f.wait(ctx)
}

// roles is a process's answers to Role: role, and how often it was asked.
type roles struct {
	mu    sync.Mutex
	role  string
	asked int
}

func (r *roles) get(context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked++
	return r.role, nil
}

func (r *roles) set(role string) {
	r.mu.Lock()
	r.role = role
	r.mu.Unlock()
}

func (r *roles) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.asked
}

// waitUntil polls cond until it holds, failing after a generous deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A frozen primary neither answers nor refuses. A call stuck on it is
// abandoned as Unavailable once the shard's other process says it is
// the primary (the chief promoted it), and the retry goes there; while
// the other says "standby" the call waits, as a sync pull at the
// barrier must.
func TestFailoverLeavesAFrozenPrimaryForItsSuccessor(t *testing.T) {
	var logs syncbuf.Buffer
	frozen := &frozenProc{thaw: make(chan struct{})}
	standby := &fakeProc{name: "standby/3"}
	standbyRole := &roles{role: "standby"}
	f := worker.NewFailover(3, worker.Process{Task: "ps/3", Client: frozen, Role: (&roles{role: "primary"}).get},
		worker.Process{Task: "standby/3", Client: standby, Role: standbyRole.get}, slog.New(slog.NewTextHandler(&logs, nil)))

	type result struct {
		resp *pb.PullResponse
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := f.Pull(context.Background(), &pb.PullRequest{})
		got <- result{resp, err}
	}()
	waitUntil(t, "the standby asked twice whether it is the primary", func() bool { return standbyRole.count() >= 2 })
	select {
	case r := <-got:
		t.Fatalf("the call to the frozen process ended (%v, %v) while its peer was still a standby", r.resp, r.err)
	default:
	}

	standbyRole.set("primary") // the chief promoted it
	var r result
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("the call to the frozen primary was not abandoned after its standby was promoted")
	}
	if status.Code(r.err) != codes.Unavailable || !strings.Contains(r.err.Error(), "standby/3 serves as shard 3's primary now") {
		t.Fatalf("abandoned call: %v, want Unavailable naming standby/3 as the primary", r.err)
	}
	if switches(&logs) != 1 {
		t.Fatalf("%d switch lines, want 1:\n%s", switches(&logs), logs.String())
	}
	if resp, err := f.Pull(context.Background(), &pb.PullRequest{}); err != nil || resp.Version != 7 || standby.calls.Load() != 1 {
		t.Fatalf("retry: %v, %v after %d standby calls; want the promoted standby's answer", resp, err, standby.calls.Load())
	}
	if n := frozen.calls.Load(); n != 1 {
		t.Fatalf("the frozen process got %d calls, want 1", n)
	}
}

// A slow call whose process answers in the end is not abandoned while
// the other process is a standby.
func TestFailoverWaitsOutASlowPrimary(t *testing.T) {
	var logs syncbuf.Buffer
	slow := &frozenProc{thaw: make(chan struct{})}
	standbyRole := &roles{role: "standby"}
	f := worker.NewFailover(3, worker.Process{Task: "ps/3", Client: slow},
		worker.Process{Task: "standby/3", Client: &fakeProc{}, Role: standbyRole.get}, slog.New(slog.NewTextHandler(&logs, nil)))
	got := make(chan error, 1)
	go func() {
		_, err := f.Push(context.Background(), &pb.PushRequest{})
		got <- err
	}()
	waitUntil(t, "the standby asked twice", func() bool { return standbyRole.count() >= 2 })
	close(slow.thaw)
	if err := <-got; err != nil {
		t.Fatalf("slow push: %v, want its answer", err)
	}
	if switches(&logs) != 0 {
		t.Fatalf("switched away from a slow primary:\n%s", logs.String())
	}
}

// otherLayoutProc answers the first `wrong` pulls with the parameters of
// a shard of another layout (one value fewer), as a shard restored in
// the layout in effect answers a worker that already switched; then it
// is the real shard.
type otherLayoutProc struct {
	worker.DataPlane
	wrong atomic.Int64
}

func (o *otherLayoutProc) Pull(ctx context.Context, in *pb.PullRequest, opts ...grpc.CallOption) (*pb.PullResponse, error) {
	resp, err := o.DataPlane.Pull(ctx, in, opts...)
	if err == nil && o.wrong.Add(-1) >= 0 {
		return &pb.PullResponse{Version: resp.Version, Generation: resp.Generation, Done: resp.Done, DataPosition: resp.DataPosition,
			Params: resp.Params[:len(resp.Params)-4]}, nil
	}
	return resp, err
}

// TestAPullOfAnotherLayoutIsRetried: a shard that answers with another
// number of parameters than the worker's plan serves another layout (a
// change of the PS count under way or undone); the worker waits for it
// as for a shard that is down, and trains on once it agrees, instead of
// exiting. With compressed pulls the shard's first answer to the worker
// is whole, and tells its size the same way.
func TestAPullOfAnotherLayoutIsRetried(t *testing.T) {
	for _, codec := range []string{"none", "none/int8"} {
		t.Run(strings.ReplaceAll(codec, "/", "-"), func(t *testing.T) {
			spec := model.Spec{Input: 16, Hidden: []int{8}, Classes: 3}
			run := config.Default()
			run.LRSchedule = "constant"
			run.Mode, run.PS, run.Workers, run.Batch, run.Hidden, run.LR, run.DataPlane = config.Async, 2, 1, 16, spec.Hidden, 0.05, config.GRPC
			run.Compress = codec
			data := testcluster.Synthetic(300, spec.Input, spec.Classes, 5)
			const total = 30
			c := startCluster(t, run, spec, total)
			var proc *otherLayoutProc
			var logs syncbuf.Buffer
			startWorker(t, c, context.Background(), 0, countingSource(data, run.Batch, 0), func(cfg *worker.Config) {
				sh := &cfg.Shards[0]
				if sh.Puller == nil {
					sh.Puller = sh.Client
				}
				proc = &otherLayoutProc{DataPlane: sh.Puller}
				proc.wrong.Store(3)
				sh.Puller = proc
				cfg.Log = slog.New(slog.NewTextHandler(&logs, nil))
			})
			waitAll(t, c)
			if st, _ := c.PS(0).Status(); st.Version != total {
				t.Fatalf("shard 0 at version %d, want %d", st.Version, total)
			}
			if n := proc.wrong.Load(); n >= 0 {
				t.Fatalf("%d of the answers of another layout were not asked for", n+1)
			}
			if !strings.Contains(logs.String(), "the layouts differ") {
				t.Fatalf("no retry of the answer of another layout in the log:\n%s", logs.String())
			}
		})
	}
}

// ridingProc is a segmentedProc that also sends row pushes ahead of a
// push (worker.RowsPusher): the first row is taken, then the call
// fails as fakeProc's answer says.
type ridingProc struct{ segmentedProc }

func (r ridingProc) PushAfterRows(ctx context.Context, rows []*pb.PushRowsRequest, in *pb.PushRequest, _ [][]float32) ([]*pb.PushRowsResponse, *pb.PushResponse, error) {
	answers := make([]*pb.PushRowsResponse, len(rows))
	answers[0] = &pb.PushRowsResponse{Version: 1}
	if err := r.call(); err != nil {
		return answers, nil, err
	}
	for i := range answers {
		answers[i] = &pb.PushRowsResponse{Version: 1}
	}
	return answers, &pb.PushResponse{Version: 2}, nil
}

// A failover of two processes that send rows with a push does too: a
// failed call's answers (the rows the process took) come back with its
// error, which switches the process as a push's does.
func TestFailoverPushesRowsAndKeepsTheAnswersOfAFailedCall(t *testing.T) {
	ps := &fakeProc{name: "ps/0", answer: unavailable}
	sb := &fakeProc{name: "standby/0"}
	dp := worker.NewFailover(0, worker.Process{Task: "ps/0", Addr: "a:1", Client: ridingProc{segmentedProc{ps}}},
		worker.Process{Task: "standby/0", Addr: "b:1", Client: ridingProc{segmentedProc{sb}}}, slog.New(slog.DiscardHandler))
	rp, ok := dp.(worker.RowsPusher)
	if !ok {
		t.Fatal("a failover of two row-pushing processes is no RowsPusher")
	}
	rows := []*pb.PushRowsRequest{{Version: 1}, {Version: 1}}
	answers, _, err := rp.PushAfterRows(context.Background(), rows, &pb.PushRequest{Version: 1}, nil)
	if status.Code(err) != codes.Unavailable || len(answers) != 2 || answers[0] == nil || answers[1] != nil {
		t.Fatalf("the failed call: answers %v, err %v; want the first row taken and Unavailable", answers, err)
	}
	answers, resp, err := rp.PushAfterRows(context.Background(), rows[1:], &pb.PushRequest{Version: 1}, nil)
	if err != nil || resp.Version != 2 || len(answers) != 1 || answers[0] == nil || sb.calls.Load() != 1 {
		t.Fatalf("sent again: answers %v, %v, err %v (standby calls %d); want it taken by the standby", answers, resp, err, sb.calls.Load())
	}
}
