package chief

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
)

// fakePS is a PS process as the chief sees it through its client: the
// hot-standby roles of docs/replication.md, with a standby attached at
// once (its peer takes the primary's state and epoch), and a version
// that stays where Init put it. dead makes every call fail as a killed
// process's would.
type fakePS struct {
	pb.ParameterServerClient // the methods the chief does not call here

	addr  string
	peers map[string]*fakePS // by address: the shard's other process

	mu          sync.Mutex
	dead        bool
	frozen      bool // Status answers nothing: a SIGSTOPped process
	role        string
	epoch       int64
	version     int64
	runID       string
	standbyAddr string
	inits       []*pb.InitRequest
	promotes    []int64 // epochs
	setStandbys []string
	stops       int
	polls       int
}

var errRefused = status.Error(codes.Unavailable, "connection refused")

func (f *fakePS) Status(ctx context.Context, _ *pb.StatusRequest, _ ...grpc.CallOption) (*pb.StatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.frozen {
		f.mu.Unlock()
		<-ctx.Done()
		f.mu.Lock()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if f.dead {
		return nil, errRefused
	}
	f.polls++
	return &pb.StatusResponse{Initialized: f.role != "", RunId: f.runID, Version: f.version, Role: f.role, Epoch: f.epoch,
		StandbyAddr: f.standbyAddr, StandbyAttached: f.standbyAddr != ""}, nil
}

func (f *fakePS) Init(_ context.Context, req *pb.InitRequest, _ ...grpc.CallOption) (*pb.InitResponse, error) {
	f.mu.Lock()
	if f.dead {
		f.mu.Unlock()
		return nil, errRefused
	}
	f.inits = append(f.inits, req)
	f.role, f.epoch, f.version, f.runID, f.standbyAddr = "primary", req.Epoch, req.Version, req.RunId, req.StandbyAddr
	f.mu.Unlock()
	f.attach(req.StandbyAddr, req.Epoch, req.Version, req.RunId)
	return &pb.InitResponse{}, nil
}

// attach makes the process at addr this one's standby.
func (f *fakePS) attach(addr string, epoch, version int64, runID string) {
	if p := f.peers[addr]; p != nil {
		p.mu.Lock()
		p.role, p.epoch, p.version, p.runID = "standby", epoch, version, runID
		p.mu.Unlock()
	}
}

func (f *fakePS) Promote(_ context.Context, req *pb.PromoteRequest, _ ...grpc.CallOption) (*pb.PromoteResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return nil, errRefused
	}
	f.promotes = append(f.promotes, req.Epoch)
	if f.role != "standby" || req.Epoch <= f.epoch {
		return nil, status.Errorf(codes.FailedPrecondition, "role %q epoch %d", f.role, f.epoch)
	}
	f.role, f.epoch, f.standbyAddr = "primary", req.Epoch, ""
	return &pb.PromoteResponse{Version: f.version}, nil
}

func (f *fakePS) SetStandby(_ context.Context, req *pb.SetStandbyRequest, _ ...grpc.CallOption) (*pb.SetStandbyResponse, error) {
	f.mu.Lock()
	if f.dead {
		f.mu.Unlock()
		return nil, errRefused
	}
	f.setStandbys = append(f.setStandbys, req.Addr)
	if f.role != "primary" || req.Epoch < f.epoch {
		f.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "role %q epoch %d", f.role, f.epoch)
	}
	f.epoch, f.standbyAddr = req.Epoch, req.Addr
	version, runID := f.version, f.runID
	f.mu.Unlock()
	f.attach(req.Addr, req.Epoch, version, runID)
	return &pb.SetStandbyResponse{}, nil
}

func (f *fakePS) SetMembership(context.Context, *pb.MembershipRequest, ...grpc.CallOption) (*pb.MembershipResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead || f.role != "primary" {
		return nil, errRefused
	}
	return &pb.MembershipResponse{Version: f.version}, nil
}

func (f *fakePS) Stop(_ context.Context, req *pb.StopRequest, _ ...grpc.CallOption) (*pb.StopResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dead {
		return nil, errRefused
	}
	if !req.Shutdown {
		f.stops++
	}
	return &pb.StopResponse{}, nil
}

// with reads f under its lock.
func with[T any](f *fakePS, get func(f *fakePS) T) T {
	f.mu.Lock()
	defer f.mu.Unlock()
	return get(f)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The driver with hot standbys, over fake PS clients: Init goes to ps/N
// with epoch 1 and its standby's address; when ps/0 dies, standby/0 is
// promoted at epoch 2 and becomes what the chief calls "shard 0" (the
// stop goes to it, not to ps/0); ps/0 back empty is attached to it as
// its standby; the report records the failover.
// failoverCluster is a chief driving fake PS processes with hot
// standbys: two shards, one worker, every task registered.
type failoverCluster struct {
	ps, standbys []*fakePS
	c            *Chief
	m            *metrics.Chief
	cancel       context.CancelFunc
	done         chan failoverResult
}

type failoverResult struct {
	rep *report.Report
	err error
}

func startFailoverCluster(t *testing.T, silentAfter time.Duration) *failoverCluster {
	t.Helper()
	r := config.Default()
	r.PS, r.Workers, r.TargetAccuracy = 2, 1, 0
	spec := r.Spec(784, 10)
	peers := map[string]*fakePS{}
	fc := &failoverCluster{m: metrics.NewChief(prometheus.NewRegistry()), done: make(chan failoverResult, 1)}
	var cps, cstandbys []PS
	for s := range r.PS {
		p := &fakePS{addr: fmt.Sprintf("ps%d:1", s), peers: peers}
		b := &fakePS{addr: fmt.Sprintf("standby%d:1", s), peers: peers}
		peers[p.addr], peers[b.addr] = p, b
		fc.ps, fc.standbys = append(fc.ps, p), append(fc.standbys, b)
		cps, cstandbys = append(cps, PS{Addr: p.addr, Client: p}), append(cstandbys, PS{Addr: b.addr, Client: b})
	}
	c, err := New(Config{Run: r, Spec: spec, RunID: "run-1", PS: cps, Standbys: cstandbys, Metrics: fc.m,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), PollEvery: 5 * time.Millisecond, SilentAfter: silentAfter})
	if err != nil {
		t.Fatal(err)
	}
	fc.c = c
	ctx, cancel := context.WithCancel(context.Background())
	fc.cancel = cancel
	t.Cleanup(cancel)
	go func() { rep, err := c.Run(ctx); fc.done <- failoverResult{rep, err} }()
	for _, reg := range []struct {
		role string
		n    int
	}{{"ps", r.PS}, {"standby", r.PS}, {"worker", r.Workers}} {
		for i := range reg.n {
			if _, err := c.Register(ctx, &pb.RegisterRequest{Role: reg.role, Index: int32(i), Settings: convert.Settings(r), ModelSpec: convert.ModelSpec(spec)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "ps/0 initialised", func() bool { return with(fc.ps[0], func(f *fakePS) int { return len(f.inits) }) == 1 })
	// Two polls since the Init: the chief has seen the standby attached.
	polled := with(fc.ps[0], func(f *fakePS) int { return f.polls })
	waitFor(t, "two polls of ps/0", func() bool { return with(fc.ps[0], func(f *fakePS) int { return f.polls }) >= polled+2 })
	return fc
}

// finish interrupts the run and returns its report.
func (fc *failoverCluster) finish(t *testing.T) *report.Report {
	t.Helper()
	fc.cancel()
	var res failoverResult
	select {
	case res = <-fc.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the chief did not finish after the interrupt")
	}
	if res.err != nil {
		t.Fatal(res.err)
	}
	return res.rep
}

// failovers are the report's restarts that were failovers.
func failovers(rep *report.Report) []report.Restart {
	var fo []report.Restart
	for _, x := range rep.Restarts {
		if x.TookOver != "" {
			fo = append(fo, x)
		}
	}
	return fo
}

func TestDriverFailsOverToTheStandby(t *testing.T) {
	fc := startFailoverCluster(t, 0)
	ps, standbys, m := fc.ps, fc.standbys, fc.m
	for s, p := range ps {
		in := with(p, func(f *fakePS) *pb.InitRequest { return f.inits[0] })
		if in.Epoch != 1 || in.StandbyAddr != standbys[s].addr {
			t.Errorf("ps/%d Init epoch=%d standby_addr=%q, want 1 and %q", s, in.Epoch, in.StandbyAddr, standbys[s].addr)
		}
	}

	ps[0].mu.Lock()
	ps[0].dead = true
	ps[0].mu.Unlock()
	waitFor(t, "standby/0 promoted", func() bool { return with(standbys[0], func(f *fakePS) string { return f.role }) == "primary" })
	if got := with(standbys[0], func(f *fakePS) []int64 { return f.promotes }); !slices.Equal(got, []int64{2}) {
		t.Errorf("standby/0 promoted at epochs %v, want [2]", got)
	}

	// ps/0 comes back empty: attached to standby/0 as its standby.
	ps[0].mu.Lock()
	ps[0].dead, ps[0].role, ps[0].epoch, ps[0].runID = false, "", 0, ""
	ps[0].mu.Unlock()
	waitFor(t, "ps/0 attached as standby/0's standby", func() bool { return with(ps[0], func(f *fakePS) string { return f.role }) == "standby" })
	if got := with(standbys[0], func(f *fakePS) []string { return f.setStandbys }); !slices.Equal(got, []string{ps[0].addr}) {
		t.Errorf("standby/0 told of standbys %q, want [%q]", got, ps[0].addr)
	}
	if e := with(ps[0], func(f *fakePS) int64 { return f.epoch }); e != 3 {
		t.Errorf("ps/0 is a standby at epoch %d, want 3", e)
	}

	rep := fc.finish(t) // interrupt: the stop goes to each shard's primary
	stops := []int{with(ps[0], func(f *fakePS) int { return f.stops }), with(standbys[0], func(f *fakePS) int { return f.stops }),
		with(ps[1], func(f *fakePS) int { return f.stops }), with(standbys[1], func(f *fakePS) int { return f.stops })}
	if !slices.Equal(stops, []int{0, 1, 1, 0}) {
		t.Errorf("stops to ps/0, standby/0, ps/1, standby/1: %v, want [0 1 1 0]", stops)
	}
	fo := failovers(rep)
	if len(fo) != 1 || fo[0].Task != "ps/0" || fo[0].TookOver != "standby/0" || fo[0].StepsLost != 0 || fo[0].BackAtSeconds == nil {
		t.Errorf("failovers in the report %+v, want one of ps/0 to standby/0 losing 0 steps", fo)
	}
	if n := testutil.ToFloat64(m.Failovers.WithLabelValues("0")); n != 1 {
		t.Errorf("failovers{shard=0} = %g, want 1", n)
	}
	if fc.c.core.Generation() != 1 { // (Run has returned: the core is ours)
		t.Errorf("generation %d after a failover, want 1 (nothing restored)", fc.c.core.Generation())
	}
}

// A frozen primary (it neither answers nor refuses) is given up after
// SilentAfter, not the 5 s a poll waits without standbys, and the
// failover the report shows counts from the poll it did not answer: the
// silence is part of the pause workers saw.
func TestDriverPromotesPastAFrozenPrimary(t *testing.T) {
	const silent = 300 * time.Millisecond
	fc := startFailoverCluster(t, silent)
	frozeAt := time.Now()
	fc.ps[0].mu.Lock()
	fc.ps[0].frozen = true
	fc.ps[0].mu.Unlock()
	waitFor(t, "standby/0 promoted", func() bool { return with(fc.standbys[0], func(f *fakePS) string { return f.role }) == "primary" })
	if waited := time.Since(frozeAt); waited >= pollTimeout {
		t.Errorf("standby/0 promoted %v after ps/0 froze: the poll waited as long as without standbys (%v)", waited, pollTimeout)
	}
	fo := failovers(fc.finish(t))
	if len(fo) != 1 || fo[0].Task != "ps/0" || fo[0].TookOver != "standby/0" {
		t.Fatalf("failovers in the report %+v, want one of ps/0 to standby/0", fo)
	}
	if fo[0].FailoverSeconds < silent.Seconds() {
		t.Errorf("failover of a frozen primary reported as %.3f s: less than the %v it went unanswered", fo[0].FailoverSeconds, silent)
	}
}
