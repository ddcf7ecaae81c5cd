package ps

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

// link is a primary's connection to its standby, in memory. Before each
// batch reaches the standby, onBatch may "kill" the primary: the batch is
// then lost (or, with ackLost, applied by the standby but its
// acknowledgement lost), and the link stays cut.
type link struct {
	pb.ParameterServerClient // only Replicate is called
	to                       *Server
	mu                       sync.Mutex
	cut                      bool
	onBatch                  func(*pb.ReplicaBatch) (kill, ackLost bool)
	killed                   func()
	gate                     func(*pb.ReplicaBatch) // called before a batch is delivered (may block)
	// dropAck, when it says so, delivers the batch and loses its
	// acknowledgement (the primary sends it again).
	dropAck func(*pb.ReplicaBatch) bool
}

// linkDialer reaches whatever link *l holds when the server dials (a
// test sets it after building the server).
func linkDialer(l **link) ReplicaDialer {
	return func(context.Context, string) (ReplicaClient, func() error, error) {
		return *l, func() error { return nil }, nil
	}
}

func (l *link) Replicate(ctx context.Context, b *pb.ReplicaBatch, _ ...grpc.CallOption) (*pb.ReplicaAck, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		return nil, status.Error(codes.Unavailable, "the primary is dead")
	}
	if l.gate != nil {
		l.gate(b)
	}
	if l.dropAck != nil && l.dropAck(b) {
		if _, err := l.to.Replicate(ctx, b); err != nil {
			return nil, err
		}
		return nil, status.Error(codes.Unavailable, "the acknowledgement was lost")
	}
	if l.onBatch != nil {
		if kill, ackLost := l.onBatch(b); kill {
			if ackLost {
				if _, err := l.to.Replicate(ctx, b); err != nil {
					return nil, err
				}
			}
			l.cut = true
			l.killed()
			return nil, status.Error(codes.Unavailable, "the primary died")
		}
	}
	return l.to.Replicate(ctx, b)
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// replicaInit is the Init of shard 0 of 1 of a small model.
func replicaInit(t *testing.T, mode config.Mode, epoch int64, standby string) (*pb.InitRequest, int) {
	t.Helper()
	spec := model.Spec{Input: 50, Hidden: []int{40}, Classes: 10}
	plan, err := partition.New(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := config.Default()
	r.Mode, r.Workers, r.PS, r.Optimizer, r.LRSchedule, r.WarmupSteps, r.LR = mode, 2, 1, "momentum", "cosine", 3, 0.1
	n := plan.Shards[0].Size
	params := make([]float32, n)
	for i := range params {
		params[i] = float32(i%7) / 7
	}
	return &pb.InitRequest{RunId: "r", Shard: 0, NumShards: 1, ShardOptions: OptionsFor(r).Proto(),
		Params: wire.Bytes(params), ModelSpec: convert.ModelSpec(spec), MaxVersion: 1000, StepsPerEpoch: 10,
		Generation: 1, Epoch: epoch, StandbyAddr: standby}, n
}

// gradOf is worker w's gradient for its i-th push: fixed numbers, so two
// runs of the same pushes apply the same floats.
func gradOf(w, i, n int) []float32 {
	g := make([]float32, n)
	for j := range g {
		g[j] = float32((w+1)*(j+3)%11-5) / float32(1+i%5)
	}
	return g
}

// failover sends a worker's requests to the shard's current process and
// switches to the other on Unavailable, as a worker's client does.
type failover struct {
	procs  [2]*Server
	dead   [2]chan struct{}
	cur    int
	orphan int // pushes a dead process never answered
}

func (f *failover) push(t *testing.T, req *pb.PushRequest) *pb.PushResponse {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		i := f.cur
		type result struct {
			resp *pb.PushResponse
			err  error
		}
		ch := make(chan result, 1)
		go func() {
			resp, err := f.procs[i].Push(context.Background(), req)
			ch <- result{resp, err}
		}()
		var res result
		select {
		case res = <-ch:
			select {
			case <-f.dead[i]:
				// Answered after its process died: nobody hears it.
				res = result{err: status.Error(codes.Unavailable, "dead")}
			default:
			}
		case <-f.dead[i]:
			f.orphan++
			res = result{err: status.Error(codes.Unavailable, "connection lost")}
		}
		if res.err == nil {
			return res.resp
		}
		if status.Code(res.err) != codes.Unavailable {
			t.Fatalf("push %+v: %v", req, res.err)
		}
		f.cur = 1 - f.cur
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("push of worker %d at version %d: no process took it", req.Worker, req.Version)
	return nil
}

func (f *failover) pull(t *testing.T, worker int32, minVersion int64) *pb.PullResponse {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-f.dead[f.cur]:
			f.cur = 1 - f.cur
			continue
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		resp, err := f.procs[f.cur].Pull(ctx, &pb.PullRequest{Worker: worker, MinVersion: minVersion, RunId: "r"})
		cancel()
		if err == nil {
			return resp
		}
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
			t.Fatalf("pull: %v", err)
		}
		f.cur = 1 - f.cur
	}
	t.Fatalf("pull of worker %d at version %d: nobody answered", worker, minVersion)
	return nil
}

// trainPushes runs steps of two workers pushing in index order through
// push, each pulling the next version first, and returns the final
// parameters as pulled.
func trainPushes(t *testing.T, mode config.Mode, steps int, push func(*pb.PushRequest) *pb.PushResponse,
	pull func(worker int32, min int64) *pb.PullResponse, n int) []float32 {
	t.Helper()
	var pos [2]int64
	var last *pb.PullResponse
	for i := range steps {
		for w := range int32(2) {
			min := int64(0)
			if mode == config.Sync {
				min = int64(i)
			}
			view := pull(w, min)
			pos[w]++
			push(&pb.PushRequest{Worker: w, Version: view.Version, Grad: wire.Bytes(gradOf(int(w), i, n)), RunId: "r",
				Generation: 1, DataPosition: pos[w]})
		}
	}
	last = pull(0, 0)
	if mode == config.Sync && last.Version != int64(steps) {
		t.Fatalf("after %d steps the shard is at version %d", steps, last.Version)
	}
	p, err := wire.Floats(last.Params)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(p)
}

// A primary killed around the replication of a push — before its standby
// got it, or after the standby applied it but before the primary heard so
// — never acknowledges it; the worker sends it to the promoted standby,
// and the run ends with exactly the parameters of an undisturbed run.
func TestFailoverLosesNoAcknowledgedPush(t *testing.T) {
	const steps = 12
	cases := []struct {
		name       string
		mode       config.Mode
		killWorker int32 // the push whose replication the primary dies in
		killAt     int64 // that worker's data position
		ackLost    bool
	}{
		{"sync first push of a step, lost", config.Sync, 0, 5, false},
		{"sync push completing a step, lost", config.Sync, 1, 5, false},
		{"sync push completing a step, applied by the standby", config.Sync, 1, 7, true},
		{"async push, lost", config.Async, 1, 6, false},
		{"async push, applied by the standby", config.Async, 0, 6, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The undisturbed run: one process, no standby.
			ref := NewServer(Config{Log: quietLog(), Shard: AnyShard})
			req, n := replicaInit(t, c.mode, 0, "")
			if _, err := ref.Init(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			want := trainPushes(t, c.mode, steps,
				func(r *pb.PushRequest) *pb.PushResponse {
					resp, err := ref.Push(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					return resp
				},
				func(w int32, min int64) *pb.PullResponse {
					resp, err := ref.Pull(ctx, &pb.PullRequest{Worker: w, MinVersion: min, RunId: "r"})
					if err != nil {
						t.Fatal(err)
					}
					return resp
				}, n)

			var l *link
			primary, standby := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)}), NewServer(Config{Log: quietLog(), Shard: AnyShard})
			f := &failover{procs: [2]*Server{primary, standby}, dead: [2]chan struct{}{make(chan struct{}), make(chan struct{})}}
			killed := false
			l = &link{to: standby}
			l.onBatch = func(b *pb.ReplicaBatch) (bool, bool) {
				for _, op := range b.Ops {
					if p := op.GetPush(); p != nil && p.Worker == c.killWorker && p.DataPosition == c.killAt {
						return true, c.ackLost
					}
				}
				return false, false
			}
			l.killed = func() {
				killed = true
				close(f.dead[0])
				// The chief's part: promote the standby.
				if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
					t.Error(err)
				}
			}
			t.Cleanup(primary.Close)
			req, _ = replicaInit(t, c.mode, 1, "standby")
			if _, err := primary.Init(ctx, req); err != nil {
				t.Fatal(err)
			}
			waitAttached(t, primary)
			got := trainPushes(t, c.mode, steps, func(r *pb.PushRequest) *pb.PushResponse { return f.push(t, r) },
				func(w int32, min int64) *pb.PullResponse { return f.pull(t, w, min) }, n)
			if !killed {
				t.Fatal("the primary was never killed: the test proves nothing")
			}
			if f.orphan != 1 {
				t.Errorf("%d pushes were left unanswered by the dead primary, want 1 (the one it died replicating)", f.orphan)
			}
			if f.cur != 1 {
				t.Error("the run did not end on the promoted standby")
			}
			if !slices.Equal(got, want) {
				t.Fatalf("parameters after the failover differ from the undisturbed run's:\n got %v\nwant %v", got[:6], want[:6])
			}
			st, err := standby.Status(ctx, &pb.StatusRequest{})
			if err != nil || st.Role != rolePrimary || st.Epoch != 2 {
				t.Fatalf("the promoted standby's status: %+v, %v", st, err)
			}
		})
	}
}

func waitAttached(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st, err := s.Status(context.Background(), &pb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.StandbyAttached {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the standby never attached")
}

// attachedPair is a primary of shard 0 in mode and its standby, linked in
// memory, the standby attached; n is the shard's size.
func attachedPair(t *testing.T, mode config.Mode) (primary, standby *Server, l *link, n int) {
	t.Helper()
	var back *link // the standby's way to the primary, once promoted
	primary = NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)})
	standby = NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&back)})
	l, back = &link{to: standby}, &link{to: primary}
	t.Cleanup(primary.Close)
	req, n := replicaInit(t, mode, 1, "standby")
	if _, err := primary.Init(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, primary)
	return primary, standby, l, n
}

// A standby refuses workers, and a deposed primary acknowledges nothing:
// once its standby was promoted at a newer epoch, its next batch is
// refused and it steps down.
func TestStandbyRefusesWorkersAndFencesItsOldPrimary(t *testing.T) {
	ctx := context.Background()
	primary, standby, _, n := attachedPair(t, config.Sync)
	_, err := standby.Push(ctx, &pb.PushRequest{Worker: 0, Grad: wire.Bytes(make([]float32, n)), RunId: "r", Generation: 1})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a standby took a worker's push: %v", err)
	}
	if _, err := standby.Pull(ctx, &pb.PullRequest{Worker: 0, RunId: "r"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a standby answered a worker's pull: %v", err)
	}
	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("promotion at the current epoch: %v", err)
	}
	// The primary is frozen (as far as the chief can tell); its standby is
	// promoted. The old primary wakes up and takes a push: the standby
	// refuses the batch, the primary is deposed and refuses the push.
	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	_, err = primary.Push(ctx, &pb.PushRequest{Worker: 0, Grad: wire.Bytes(gradOf(0, 0, n)), RunId: "r", Generation: 1, DataPosition: 1})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a deposed primary's push: %v, want Unavailable", err)
	}
	st, _ := primary.Status(ctx, &pb.StatusRequest{})
	if st.Role != roleDeposed {
		t.Fatalf("old primary's role %q, want deposed", st.Role)
	}
	if v, _ := standby.Status(ctx, &pb.StatusRequest{}); v.Version != 0 || v.Role != rolePrimary {
		t.Fatalf("the new primary took the deposed one's update: %+v", v)
	}
	// The new primary attaches the old one as its standby (a newer epoch).
	// (attachedPair gave the standby a link back to the primary.)
	t.Cleanup(standby.Close)
	if _, err := standby.SetStandby(ctx, &pb.SetStandbyRequest{RunId: "r", Shard: 0, Epoch: 3, Addr: "ps/0"}); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, standby)
	if st, _ := primary.Status(ctx, &pb.StatusRequest{}); st.Role != roleStandby || st.Epoch != 3 {
		t.Fatalf("the old primary after the attach: role %q epoch %d", st.Role, st.Epoch)
	}
}

// A primary whose standby died waits, and goes on alone once the chief
// drops the standby: the waiting push is then acknowledged.
func TestDroppedStandbyReleasesWaitingPushes(t *testing.T) {
	ctx := context.Background()
	primary, _, l, n := attachedPair(t, config.Sync)
	l.mu.Lock()
	l.cut = true // the standby died
	l.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := primary.Push(ctx, &pb.PushRequest{Worker: 0, Grad: wire.Bytes(gradOf(0, 0, n)), RunId: "r", Generation: 1, DataPosition: 1})
		done <- err
	}()
	// The push is applied but not acknowledged while the standby is gone.
	waitQueued(t, primary)
	select {
	case err := <-done:
		t.Fatalf("push answered while its standby was unreachable: %v", err)
	default:
	}
	if _, err := primary.SetStandby(ctx, &pb.SetStandbyRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the push still waits after the standby was dropped")
	}
	if _, err := primary.SetStandby(ctx, &pb.SetStandbyRequest{RunId: "r", Shard: 0, Epoch: 1}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a set-standby of an older epoch: %v", err)
	}
}

// Without a standby a push copies nothing for replication: the data
// plane's push path allocates no gradient-sized buffer (a PS collects
// garbage at 10% growth; a copy per push once made its CPU six-fold).
func TestPushWithoutStandbyAllocatesNoPayload(t *testing.T) {
	srv := NewServer(Config{Log: quietLog(), Shard: AnyShard})
	req, n := replicaInit(t, config.Async, 0, "")
	if _, err := srv.Init(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	g := wire.Bytes(gradOf(0, 0, n))
	push := &pb.PushRequest{Worker: 0, Grad: g, RunId: "r", Generation: 1}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const pushes = 50
	for i := range pushes {
		push.Version, push.DataPosition = int64(i), int64(i+1)
		if _, err := srv.Push(context.Background(), push); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / pushes; per >= uint64(len(g)) {
		t.Fatalf("a push allocated %d bytes, a payload is %d: something copies it", per, len(g))
	}
}

// While a standby's snapshot travels the primary answers pushes alone;
// once the standby holds the snapshot it must also hold those pushes
// before it counts as attached (the chief promotes only an attached
// standby), and a pull shows nothing it lacks meanwhile.
func TestStandbyAttachedOnlyOnceCaughtUp(t *testing.T) {
	ctx := context.Background()
	var l *link
	primary, standby := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)}), NewServer(Config{Log: quietLog(), Shard: AnyShard})
	snapshotSent, releaseSnapshot := make(chan struct{}), make(chan struct{})
	catchUpSent, releaseCatchUp := make(chan struct{}), make(chan struct{})
	l = &link{to: standby}
	l.gate = func(b *pb.ReplicaBatch) {
		switch {
		case b.Ops[0].GetSnapshot() != nil:
			close(snapshotSent)
			<-releaseSnapshot
		case b.FirstSeq == 2:
			close(catchUpSent)
			<-releaseCatchUp
		}
	}
	t.Cleanup(primary.Close)
	req, n := replicaInit(t, config.Async, 1, "standby")
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	<-snapshotSent
	// Two pushes while the snapshot travels: answered at once.
	for i := range 2 {
		if _, err := primary.Push(ctx, &pb.PushRequest{Worker: 0, Version: int64(i), Grad: wire.Bytes(gradOf(0, i, n)),
			RunId: "r", Generation: 1, DataPosition: int64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	close(releaseSnapshot)
	<-catchUpSent
	// The standby holds the snapshot, not yet the two pushes.
	st, _ := primary.Status(ctx, &pb.StatusRequest{})
	if st.StandbyAttached {
		t.Fatal("a standby missing two answered pushes counts as attached: promoting it would lose them")
	}
	if st.Version != 0 {
		t.Fatalf("Status shows version %d, which the standby does not hold", st.Version)
	}
	pctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := primary.Pull(pctx, &pb.PullRequest{Worker: 0, RunId: "r"})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a pull during the catch-up answered (%v): it would show versions the standby lacks", err)
	}
	close(releaseCatchUp)
	waitAttached(t, primary)
	if v, _ := standby.Status(ctx, &pb.StatusRequest{}); v.Version != 2 {
		t.Fatalf("attached standby at version %d, want 2", v.Version)
	}
}

// The state a chief's evaluation pull retains (for a target stop's final
// checkpoint) survives a failover: the standby keeps the same version's
// state, so the promoted standby can checkpoint it after more steps.
func TestRetainedStateSurvivesFailover(t *testing.T) {
	ctx := context.Background()
	primary, standby, _, n := attachedPair(t, config.Sync)
	f := &failover{procs: [2]*Server{primary, standby}, dead: [2]chan struct{}{make(chan struct{}), make(chan struct{})}}
	push := func(req *pb.PushRequest) *pb.PushResponse { return f.push(t, req) }
	trainPushes(t, config.Sync, 3, push, func(w int32, min int64) *pb.PullResponse { return f.pull(t, w, min) }, n)
	kept, err := primary.Pull(ctx, &pb.PullRequest{Worker: -1, Retain: true, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	want, err := wire.Floats(kept.Params)
	if err != nil {
		t.Fatal(err)
	}
	want = slices.Clone(want)
	// One more step, so the live state moves past the retained one.
	for w := range int32(2) {
		push(&pb.PushRequest{Worker: w, Version: kept.Version, Grad: wire.Bytes(gradOf(int(w), 9, n)), RunId: "r", Generation: 1, DataPosition: 4})
	}
	if _, err := primary.Pull(ctx, &pb.PullRequest{Worker: 0, MinVersion: kept.Version + 1, RunId: "r"}); err != nil {
		t.Fatal(err) // answered: the standby holds the step, and the retain before it
	}

	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	standby.mu.Lock()
	v := standby.shard.Version()
	r, err := standby.holdRetained(kept.Version)
	standby.mu.Unlock()
	if v != kept.Version+1 {
		t.Fatalf("promoted standby at version %d, want %d", v, kept.Version+1)
	}
	if err != nil {
		t.Fatalf("the promoted standby has no retained state of version %d: %v", kept.Version, err)
	}
	defer standby.releaseRetained(r)
	got, err := wire.Floats(r.held.b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatal("the promoted standby retained other parameters than its primary's evaluation pull saw")
	}
}

// A standby applies its primary's pushes but does not count them in the
// exported per-gradient series: a sum over PS processes counts each
// gradient once (docs/replication.md, "Metrics").
func TestStandbyDoesNotCountItsPrimarysGradients(t *testing.T) {
	primary, standby, _, n := attachedPair(t, config.Sync)
	f := &failover{procs: [2]*Server{primary, standby}, dead: [2]chan struct{}{make(chan struct{}), make(chan struct{})}}
	trainPushes(t, config.Sync, 3, func(req *pb.PushRequest) *pb.PushResponse { return f.push(t, req) },
		func(w int32, min int64) *pb.PullResponse { return f.pull(t, w, min) }, n)
	// A stale push (a version the step has passed): counted as dropped.
	f.push(t, &pb.PushRequest{Worker: 1, Version: 0, Grad: wire.Bytes(gradOf(1, 0, n)), RunId: "r", Generation: 1, DataPosition: 4})
	if _, err := primary.Pull(context.Background(), &pb.PullRequest{Worker: 0, MinVersion: 3, RunId: "r"}); err != nil {
		t.Fatal(err) // answered once the standby holds every push
	}
	count := func(s *Server) (staleness uint64, dropped float64) {
		var d dto.Metric
		if err := s.m.GradientStaleness.Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetHistogram().GetSampleCount(), testutil.ToFloat64(s.m.StaleGradientsDropped)
	}
	ps, pd := count(primary)
	ss, sd := count(standby)
	if ps != 7 || pd != 1 {
		t.Errorf("primary counted %d gradients' staleness and %g dropped, want 7 and 1", ps, pd)
	}
	if ss != 0 || sd != 0 {
		t.Errorf("standby counted %d gradients' staleness and %g dropped, want none: they are its primary's", ss, sd)
	}
	if got, _ := count(&Server{m: standby.mirror}); got != 7 {
		t.Errorf("standby applied %d gradients (its mirror series), want 7", got)
	}
}

// lent is a push buffer lent with PushKept, which records its releases.
type lent struct {
	mu       sync.Mutex
	released int
}

func (l *lent) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released++
}

func (l *lent) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released
}

// waitReleased waits until l was released once.
func (l *lent) waitReleased(t *testing.T, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); l.count() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the lent buffer was never released", what)
		}
	}
	if n := l.count(); n != 1 {
		t.Fatalf("%s: the lent buffer was released %d times", what, n)
	}
}

// A push's buffer lent with PushKept is released at once without a
// standby (or while its snapshot travels: the push is copied), and
// otherwise only once the standby holds the push, which it gets
// uncopied, or once the link is dropped.
func TestPushKeptReleasesItsBufferOnce(t *testing.T) {
	ctx := context.Background()
	pushReq := func(n, i int) *pb.PushRequest {
		return &pb.PushRequest{Worker: 0, Version: int64(i), Grad: wire.Bytes(gradOf(0, i, n)), RunId: "r", Generation: 1, DataPosition: int64(i + 1)}
	}
	t.Run("alone", func(t *testing.T) {
		srv := NewServer(Config{Log: quietLog(), Shard: AnyShard})
		req, n := replicaInit(t, config.Async, 0, "")
		if _, err := srv.Init(ctx, req); err != nil {
			t.Fatal(err)
		}
		var l lent
		if _, err := srv.PushKept(ctx, pushReq(n, 0), l.release); err != nil {
			t.Fatal(err)
		}
		if l.count() != 1 {
			t.Fatalf("released %d times by the time the push was answered, want 1", l.count())
		}
	})
	t.Run("attached", func(t *testing.T) {
		primary, standby, lk, n := attachedPair(t, config.Async)
		var got []byte
		lk.mu.Lock()
		lk.gate = func(b *pb.ReplicaBatch) {
			if p := b.Ops[0].GetPush(); p != nil {
				got = p.Grad
			}
		}
		lk.mu.Unlock()
		var l lent
		req := pushReq(n, 0)
		if _, err := primary.PushKept(ctx, req, l.release); err != nil {
			t.Fatal(err)
		}
		l.waitReleased(t, "acknowledged")
		if &got[0] != &req.Grad[0] {
			t.Fatal("the standby's batch holds a copy of the lent buffer: the copy PushKept exists to save")
		}
		if v, _ := standby.Status(ctx, &pb.StatusRequest{}); v.Version != 1 {
			t.Fatalf("standby at version %d, want 1", v.Version)
		}
		// The standby dies with a push queued: the push waits, its buffer
		// is held until the chief drops the standby.
		lk.mu.Lock()
		lk.cut = true
		lk.mu.Unlock()
		var l2 lent
		done := make(chan error, 1)
		go func() {
			_, err := primary.PushKept(ctx, pushReq(n, 1), l2.release)
			done <- err
		}()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if st, _ := primary.Status(ctx, &pb.StatusRequest{}); st.ReplicationLagUpdates == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the push never reached the replication queue")
			}
		}
		if l2.count() != 0 {
			t.Fatal("a buffer the standby's queue holds was released")
		}
		if _, err := primary.SetStandby(ctx, &pb.SetStandbyRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		l2.waitReleased(t, "dropped")
	})
	t.Run("snapshot travelling", func(t *testing.T) {
		var lk *link
		primary, standby := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&lk)}), NewServer(Config{Log: quietLog(), Shard: AnyShard})
		sent, resume := make(chan struct{}), make(chan struct{})
		lk = &link{to: standby, gate: func(b *pb.ReplicaBatch) {
			if b.Ops[0].GetSnapshot() != nil {
				close(sent)
				<-resume
			}
		}}
		t.Cleanup(primary.Close)
		req, n := replicaInit(t, config.Async, 1, "standby")
		if _, err := primary.Init(ctx, req); err != nil {
			t.Fatal(err)
		}
		<-sent
		var l lent
		_, err := primary.PushKept(ctx, pushReq(n, 0), l.release)
		close(resume)
		if err != nil {
			t.Fatal(err)
		}
		if l.count() != 1 {
			t.Fatalf("a push answered while the snapshot travels: released %d times on return, want 1 (it is copied)", l.count())
		}
		waitAttached(t, primary)
		if v, _ := standby.Status(ctx, &pb.StatusRequest{}); v.Version != 1 {
			t.Fatalf("standby at version %d, want 1", v.Version)
		}
	})
}

// waitQueued waits until one update of s waits for its standby's
// acknowledgement.
func waitQueued(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _ := s.Status(context.Background(), &pb.StatusRequest{})
		if st.ReplicationLagUpdates == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the push never reached the replication queue")
		}
		time.Sleep(time.Millisecond)
	}
}

// fakeClock is a clock a test moves (Config.Now).
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time { return time.Unix(0, c.ns.Load()) }

// The replication lag a primary reports is measured on its own clock
// (Config.Now): the age of the oldest update its standby has not
// acknowledged.
func TestReplicationLagFollowsTheServersClock(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{}
	clock.ns.Store(time.Unix(1_000_000, 0).UnixNano())
	var l *link
	primary := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l), Now: clock.now})
	standby := NewServer(Config{Log: quietLog(), Shard: AnyShard})
	l = &link{to: standby}
	t.Cleanup(primary.Close)
	req, n := replicaInit(t, config.Sync, 1, "standby")
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, primary)
	l.mu.Lock()
	l.cut = true // the standby stops acknowledging
	l.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := primary.Push(ctx, &pb.PushRequest{Worker: 0, Grad: wire.Bytes(gradOf(0, 0, n)), RunId: "r", Generation: 1, DataPosition: 1})
		done <- err
	}()
	waitQueued(t, primary)
	clock.ns.Add(int64(2500 * time.Millisecond))
	if st, _ := primary.Status(ctx, &pb.StatusRequest{}); st.ReplicationLagSeconds != 2.5 {
		t.Errorf("replication lag %v s after the clock moved 2.5 s", st.ReplicationLagSeconds)
	}
	// The gauge follows with nothing queued or acknowledged meanwhile.
	for deadline := time.Now().Add(10 * time.Second); testutil.ToFloat64(primary.m.ReplicationLagSeconds) != 2.5; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lag gauge reads %v s, the standby has not acknowledged for 2.5 s", testutil.ToFloat64(primary.m.ReplicationLagSeconds))
		}
	}
	if _, err := primary.SetStandby(ctx, &pb.SetStandbyRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A chief's Init sent again at the same epoch (its answer was lost, the
// shard had applied it) gives the primary a new link, numbered past the
// old one's operations: the standby installs its snapshot, though it
// holds updates of the link before, and the pair is attached again at
// once. The old link's batches arriving late (their calls' cancellation
// lost a race) change nothing.
func TestInitSentAgainAtTheSameEpochAttachesTheStandbyAgain(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var old []*pb.ReplicaBatch // the first link's batches
	var l *link
	primary, standby := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)}), NewServer(Config{Log: quietLog(), Shard: AnyShard})
	l = &link{to: standby, gate: func(b *pb.ReplicaBatch) {
		mu.Lock()
		defer mu.Unlock()
		old = append(old, b)
	}}
	t.Cleanup(primary.Close)
	req, n := replicaInit(t, config.Async, 1, "standby")
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, primary)
	pushAt := func(i int) {
		t.Helper()
		req := &pb.PushRequest{Worker: 0, Version: int64(i), Grad: wire.Bytes(gradOf(0, i, n)), RunId: "r", Generation: 1, DataPosition: int64(i + 1)}
		if _, err := primary.Push(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		pushAt(i)
	}
	if st, _ := standby.Status(ctx, &pb.StatusRequest{}); st.Version != 3 {
		t.Fatalf("standby at version %d after 3 pushes, want 3", st.Version)
	}
	l.mu.Lock()
	l.gate = nil
	l.mu.Unlock()
	req, _ = replicaInit(t, config.Async, 1, "standby") // the same epoch
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, primary)
	p, _ := primary.Status(ctx, &pb.StatusRequest{})
	s, _ := standby.Status(ctx, &pb.StatusRequest{})
	if p.Version != 0 || s.Version != p.Version {
		t.Fatalf("after the Init sent again: primary at version %d, standby at %d, want both at the Init's 0", p.Version, s.Version)
	}
	mu.Lock()
	late := old
	mu.Unlock()
	if len(late) != 4 || late[0].Ops[0].GetSnapshot() == nil {
		t.Fatalf("the first link sent %d batches, want its snapshot and 3 pushes", len(late))
	}
	for _, b := range late {
		if _, err := standby.Replicate(ctx, b); err != nil {
			t.Fatalf("a late batch of the first link: %v", err)
		}
	}
	if st, _ := standby.Status(ctx, &pb.StatusRequest{}); st.Version != 0 {
		t.Fatalf("the first link's late batches moved the standby to version %d", st.Version)
	}
	pushAt(0)
	if !slices.Equal(standby.shard.Params(), primary.shard.Params()) {
		t.Fatal("the standby's parameters are not the primary's after the Init sent again and a push")
	}
}

// A link's snapshot whose acknowledgement was lost is sent again and
// installed again; the updates after it reach the standby as usual.
func TestSnapshotSentAgainIsInstalledAgain(t *testing.T) {
	ctx := context.Background()
	var l *link
	primary, standby := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)}), NewServer(Config{Log: quietLog(), Shard: AnyShard})
	sent := 0
	l = &link{to: standby, dropAck: func(b *pb.ReplicaBatch) bool {
		if b.Ops[0].GetSnapshot() == nil {
			return false
		}
		sent++
		return sent == 1
	}}
	t.Cleanup(primary.Close)
	req, n := replicaInit(t, config.Async, 1, "standby")
	if _, err := primary.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, primary)
	for i := range 3 {
		req := &pb.PushRequest{Worker: 0, Version: int64(i), Grad: wire.Bytes(gradOf(0, i, n)), RunId: "r", Generation: 1, DataPosition: int64(i + 1)}
		if _, err := primary.Push(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	l.mu.Lock()
	times := sent
	l.mu.Unlock()
	if times != 2 {
		t.Fatalf("the snapshot was sent %d times, want 2 (its first acknowledgement lost)", times)
	}
	if st, _ := standby.Status(ctx, &pb.StatusRequest{}); st.Version != 3 || !slices.Equal(standby.shard.Params(), primary.shard.Params()) {
		t.Fatalf("standby at version %d after 3 pushes, or with other parameters than the primary's", st.Version)
	}
}

// A standby drops the retained state when its primary does (an
// evaluation pull without retain): a promoted standby keeps no frozen
// state its primary let go.
func TestStandbyDropsTheRetainedStateWithItsPrimary(t *testing.T) {
	ctx := context.Background()
	primary, standby, _, n := attachedPair(t, config.Sync)
	f := &failover{procs: [2]*Server{primary, standby}, dead: [2]chan struct{}{make(chan struct{}), make(chan struct{})}}
	trainPushes(t, config.Sync, 3, func(req *pb.PushRequest) *pb.PushResponse { return f.push(t, req) },
		func(w int32, min int64) *pb.PullResponse { return f.pull(t, w, min) }, n)
	_, err := primary.Pull(ctx, &pb.PullRequest{Worker: -1, Retain: true, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := primary.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	waitAcked(t, primary)
	if _, err := standby.Promote(ctx, &pb.PromoteRequest{RunId: "r", Shard: 0, Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	standby.mu.Lock()
	_, err = standby.holdRetained(0)
	standby.mu.Unlock()
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("the promoted standby still holds the state its primary dropped: %v", err)
	}
}

// waitAcked waits until s's standby has acknowledged every operation
// queued for it.
func waitAcked(t *testing.T, s *Server) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st, _ := s.Status(context.Background(), &pb.StatusRequest{}); st.ReplicationLagUpdates == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby never acknowledged every operation")
		}
	}
}

// A primary whose process restarted and got the same Init again (the
// chief's retry at the same epoch) numbers its new link from 1, below
// what the standby holds of the epoch: the standby skips that snapshot
// as an older link's, and the primary numbers the link past its
// operations and sends the snapshot again, which the standby installs.
func TestRestartedPrimaryAtTheSameEpochAttachesTheStandby(t *testing.T) {
	ctx := context.Background()
	primary, standby, l, n := attachedPair(t, config.Async)
	for i := range 3 {
		req := &pb.PushRequest{Worker: 0, Version: int64(i), Grad: wire.Bytes(gradOf(0, i, n)), RunId: "r", Generation: 1, DataPosition: int64(i + 1)}
		if _, err := primary.Push(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	primary.Close() // the process dies; a new one comes up empty
	again := NewServer(Config{Log: quietLog(), Shard: AnyShard, Dial: linkDialer(&l)})
	t.Cleanup(again.Close)
	req, _ := replicaInit(t, config.Async, 1, "standby")
	if _, err := again.Init(ctx, req); err != nil {
		t.Fatal(err)
	}
	waitAttached(t, again)
	if st, _ := standby.Status(ctx, &pb.StatusRequest{}); st.Version != 0 || !slices.Equal(standby.shard.Params(), again.shard.Params()) {
		t.Fatalf("standby at version %d after the restarted primary's Init, want its 0 and its parameters", st.Version)
	}
	req2 := &pb.PushRequest{Worker: 0, Version: 0, Grad: wire.Bytes(gradOf(0, 0, n)), RunId: "r", Generation: 1, DataPosition: 1}
	if _, err := again.Push(ctx, req2); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(standby.shard.Params(), again.shard.Params()) {
		t.Fatal("the standby's parameters are not the restarted primary's after a push")
	}
}
