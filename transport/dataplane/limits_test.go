package dataplane

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/certs"
	"github.com/pstrain/pstrain/transport/tlsconf"
)

// serveLimited starts a server for b with cfg (its Log, if nil, drops
// everything) on lis (nil: a loopback port) and returns it with its
// address and metrics.
func serveLimited(t *testing.T, b Backend, lis net.Listener, cfg Config) (*Server, string, *metrics.PS) {
	t.Helper()
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = 64 << 20
	}
	m := metrics.NewPS(prometheus.NewRegistry())
	cfg.Metrics = m
	s := NewServer(b, lis, cfg)
	serveTest(t, s)
	return s, lis.Addr().String(), m
}

// eventually waits until cond holds, failing t after 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, with a deadline
	}
}

// closedByPeer reads c until the server closes it (true) or d passes.
func closedByPeer(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func closedFor(m *metrics.PS, reason string) float64 {
	return testutil.ToFloat64(m.ConnectionsClosed.WithLabelValues("data", reason))
}

func rejectedFor(m *metrics.PS, reason string) float64 {
	return testutil.ToFloat64(m.RejectedRequests.WithLabelValues(reason))
}

func TestConnectionsPastTheLimitAreClosedAndCounted(t *testing.T) {
	b := &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}
	_, addr, m := serveLimited(t, b, nil, Config{Limits: Limits{MaxConns: 2}})
	ctx := context.Background()
	c1, c2 := client(addr, 1<<20), client(addr, 1<<20)
	defer c1.Close()
	defer c2.Close()
	for _, c := range []*Client{c1, c2} {
		if _, err := c.Pull(ctx, &pb.PullRequest{RunId: "r"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.DataPlaneConnections); got != 2 {
		t.Fatalf("%v connections open, want 2", got)
	}
	// A third is closed at once: its pull is Unavailable.
	c3 := client(addr, 1<<20)
	defer c3.Close()
	if _, err := c3.Pull(ctx, &pb.PullRequest{RunId: "r"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("a pull past the connection limit: %v, want Unavailable", err)
	}
	if closedFor(m, "limit") != 1 {
		t.Fatalf("limit refusals %v, want 1", closedFor(m, "limit"))
	}
	// The first two are still served; once one goes, the third gets in.
	if _, err := c2.Pull(ctx, &pb.PullRequest{RunId: "r"}); err != nil {
		t.Fatalf("a connection within the limit: %v", err)
	}
	c1.Close()
	eventually(t, "the server lets go of a closed connection", func() bool { return testutil.ToFloat64(m.DataPlaneConnections) == 1 })
	if _, err := c3.Pull(ctx, &pb.PullRequest{RunId: "r"}); err != nil {
		t.Fatalf("after a connection closed: %v", err)
	}
}

// holdingBackend holds every push until released, and records how many
// payload bytes its pushes held at once.
type holdingBackend struct {
	mu      sync.Mutex
	inside  int // pushes in Push
	held    int // their payload bytes
	maxHeld int
	done    int
	release chan struct{}
}

func (h *holdingBackend) PullShared(context.Context, *pb.PullRequest) (*pb.PullResponse, func(), error) {
	return nil, nil, status.Error(codes.Unimplemented, "no pulls")
}

func (h *holdingBackend) Push(_ context.Context, r *pb.PushRequest) (*pb.PushResponse, error) {
	h.mu.Lock()
	h.inside++
	h.held += len(r.Grad)
	h.maxHeld = max(h.maxHeld, h.held)
	h.mu.Unlock()
	<-h.release
	h.mu.Lock()
	h.inside--
	h.held -= len(r.Grad)
	h.done++
	h.mu.Unlock()
	return &pb.PushResponse{}, nil
}

func (h *holdingBackend) state() (inside, maxHeld, done int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inside, h.maxHeld, h.done
}

// Sixteen clients push 256 KiB each at once against a 1 MiB budget:
// never more than four payloads are held (by the backend, which holds
// every push until released, or read into buffers); the others wait for
// room and all go through.
func TestBufferBudgetHoldsUnderManyConcurrentPushes(t *testing.T) {
	const size, budget, clients = 256 << 10, 1 << 20, 16
	h := &holdingBackend{release: make(chan struct{})}
	s, addr, m := serveLimited(t, h, nil, Config{Limits: Limits{MaxBuffered: budget, BufferWait: time.Minute}})
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client(addr, 1<<20)
			defer c.Close()
			_, err := c.Push(context.Background(), &pb.PushRequest{Grad: make([]byte, size), RunId: "r"})
			errs <- err
		}()
	}
	eventually(t, "four pushes fill the budget", func() bool { inside, _, _ := h.state(); return inside == budget/size })
	used, _, limit := s.bufs.stats()
	if used != budget || limit != budget {
		t.Fatalf("buffers in use %d of %d, want the whole budget of %d", used, limit, budget)
	}
	if got := testutil.ToFloat64(m.DataPlaneBuffered); got != budget {
		t.Fatalf("%s = %v, want %d", metrics.MetricPSDataPlaneBuffered, got, budget)
	}
	// The other twelve wait: none is read while the budget is full.
	if inside, _, _ := h.state(); inside != budget/size {
		t.Fatalf("%d pushes inside with a full budget", inside)
	}
	close(h.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("push: %v", err)
		}
	}
	_, maxHeld, done := h.state()
	if done != clients || maxHeld != budget {
		t.Fatalf("%d pushes done (want %d); at most %d bytes held at once, want exactly the budget %d", done, clients, maxHeld, budget)
	}
	// Unknown push size: nothing is kept for reuse, the budget comes
	// free (a buffer is released just after its response is written).
	eventually(t, "the budget free after the pushes", func() bool { used, kept, _ := s.bufs.stats(); return used == 0 && kept == 0 })
	if rejectedFor(m, "busy") != 0 {
		t.Fatalf("%v pushes refused as busy with a minute to wait", rejectedFor(m, "busy"))
	}
}

// A push that finds no room within BufferWait is refused as Unavailable
// (workers retry it), counted, and its connection closed.
func TestPushWithoutRoomIsRefusedAsUnavailable(t *testing.T) {
	const size = 256 << 10
	h := &holdingBackend{release: make(chan struct{})}
	_, addr, m := serveLimited(t, h, nil, Config{Limits: Limits{MaxBuffered: size, BufferWait: 100 * time.Millisecond}})
	first := client(addr, 1<<20)
	defer first.Close()
	defer close(h.release) // first: the client's Close waits for its push
	go first.Push(context.Background(), &pb.PushRequest{Grad: make([]byte, size), RunId: "r"})
	eventually(t, "the first push holds the budget", func() bool { inside, _, _ := h.state(); return inside == 1 })
	c := client(addr, 1<<20)
	defer c.Close()
	_, err := c.Push(context.Background(), &pb.PushRequest{Grad: make([]byte, size), RunId: "r"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a push finding no room: %v, want Unavailable", err)
	}
	if rejectedFor(m, "busy") != 1 {
		t.Fatalf("busy refusals %v, want 1", rejectedFor(m, "busy"))
	}
}

// Once the shard's push size is known, a push announcing more is refused
// as soon as its header is in: the server answers without waiting for a
// payload the client never sends.
func TestPushLargerThanTheShardIsRefusedBeforeItsPayload(t *testing.T) {
	b := &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}
	s, addr, m := serveLimited(t, b, nil, Config{})
	s.SetPushSize(4000)
	for i, n := range []uint32{4004, 64 << 20, 1 << 31} { // past the shard, the budget, MaxPayload
		conn := dial(t, addr)
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write(appendSigned(nil, request{op: opPush, runID: "r", payloadLen: n}, nil)); err != nil {
			t.Fatal(err)
		}
		resp, err := readResponse(conn, make([]byte, respLen), 1<<20)
		if err != nil || codes.Code(resp.code) != codes.InvalidArgument {
			t.Fatalf("a push of %d bytes: %+v, %v; want InvalidArgument", n, resp, err)
		}
		if !closedByPeer(conn, 10*time.Second) {
			t.Fatal("the connection stayed open")
		}
		if got := rejectedFor(m, "too_large"); got != float64(i+1) {
			t.Fatalf("too_large refusals %v, want %d", got, i+1)
		}
	}
	// A push of the shard's size goes through, and its buffer is kept for
	// the next one.
	c := client(addr, 1<<20)
	defer c.Close()
	for range 2 {
		if _, err := c.Push(context.Background(), &pb.PushRequest{Grad: make([]byte, 4000), RunId: "r"}); err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	pushes := b.pushes
	b.mu.Unlock()
	if pushes != 2 {
		t.Fatalf("%d pushes reached the backend, want 2", pushes)
	}
	eventually(t, "one buffer of the push size kept", func() bool { used, kept, _ := s.bufs.stats(); return used == 0 && kept == 4000 })
}

// A frame must finish within FrameGrace + size/MinRate once started, a
// connection must start a request within IdleTimeout, and a response
// must be taken within the same time as a frame: otherwise the
// connection is cut and counted. A frame trickled faster than that is
// served.
func TestSlowAndIdleConnectionsAreCut(t *testing.T) {
	b := &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}
	lim := Limits{FrameGrace: 300 * time.Millisecond, MinRate: 1 << 20, IdleTimeout: 300 * time.Millisecond}
	_, addr, m := serveLimited(t, b, nil, Config{Limits: lim})
	frame := appendSigned(nil, request{op: opPush, runID: "r", payloadLen: 8}, nil)

	// Half a header, then nothing.
	conn := dial(t, addr)
	conn.Write(frame[:10])
	if !closedByPeer(conn, 10*time.Second) {
		t.Fatal("a stalled header was not cut")
	}
	eventually(t, "a slow header counted", func() bool { return closedFor(m, "slow") == 1 })

	// A header and half its payload.
	conn = dial(t, addr)
	conn.Write(append(append([]byte(nil), frame...), 1, 2, 3, 4))
	if !closedByPeer(conn, 10*time.Second) {
		t.Fatal("a stalled payload was not cut")
	}
	eventually(t, "a slow payload counted", func() bool { return closedFor(m, "slow") == 2 })

	// Nothing at all.
	conn = dial(t, addr)
	if !closedByPeer(conn, 10*time.Second) {
		t.Fatal("an idle connection was not closed")
	}
	eventually(t, "an idle connection counted", func() bool { return closedFor(m, "idle") == 1 })

	// Byte by byte, well within the frame's time: served.
	conn = dial(t, addr)
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	for _, c := range append(append([]byte(nil), frame...), make([]byte, 8)...) {
		if _, err := conn.Write([]byte{c}); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := readResponse(conn, make([]byte, respLen), 1<<20); err != nil || resp.code != 0 {
		t.Fatalf("a trickled frame: %+v, %v", resp, err)
	}
	if closedFor(m, "slow") != 2 {
		t.Fatalf("slow cuts %v after a frame in time, want 2", closedFor(m, "slow"))
	}
}

// bigPulls answers every pull with 16 MiB of parameters, more than
// socket buffers take, and counts releases.
type bigPulls struct {
	mu       sync.Mutex
	released int
}

func (p *bigPulls) PullShared(context.Context, *pb.PullRequest) (*pb.PullResponse, func(), error) {
	return &pb.PullResponse{Params: make([]byte, 16<<20)}, func() {
		p.mu.Lock()
		p.released++
		p.mu.Unlock()
	}, nil
}

func (p *bigPulls) Push(context.Context, *pb.PushRequest) (*pb.PushResponse, error) {
	return nil, status.Error(codes.Unimplemented, "no pushes")
}

// A client that asks for parameters and never reads them is cut once
// the response's time is up, and the parameters are released (a PS
// reuses them only then).
func TestReaderThatNeverReadsIsCutAndReleases(t *testing.T) {
	p := &bigPulls{}
	_, addr, m := serveLimited(t, p, nil, Config{Limits: Limits{FrameGrace: 200 * time.Millisecond, MinRate: 1 << 30}})
	conn := dial(t, addr)
	if _, err := conn.Write(appendSigned(nil, request{op: opPull, runID: "r"}, nil)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the silent reader cut", func() bool { return closedFor(m, "slow") == 1 })
	eventually(t, "the parameters released", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.released == 1 })
}

// A client whose connection the server closed while idle sends its next
// request on a new connection, without an error.
func TestClientReconnectsAfterAnIdleClose(t *testing.T) {
	b := &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}
	_, addr, m := serveLimited(t, b, nil, Config{Limits: Limits{IdleTimeout: 100 * time.Millisecond}})
	c := client(addr, 1<<20)
	defer c.Close()
	ctx := context.Background()
	grad := make([]byte, 16)
	for i := range 3 {
		if _, err := c.Push(ctx, &pb.PushRequest{Grad: grad, RunId: "r"}); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
		eventually(t, "the idle connection closed", func() bool { return closedFor(m, "idle") == float64(i+1) })
	}
	if _, err := c.Pull(ctx, &pb.PullRequest{RunId: "r"}); err != nil {
		t.Fatalf("pull after an idle close: %v", err)
	}
	b.mu.Lock()
	pushes := b.pushes
	b.mu.Unlock()
	if pushes != 3 {
		t.Fatalf("%d pushes reached the backend, want 3 (each once)", pushes)
	}
}

// logLines is a slog handler keeping the messages and their "count".
type logLines struct {
	mu    sync.Mutex
	lines []string
	count []int64
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "count" {
			n = a.Value.Int64()
		}
		return true
	})
	l.lines = append(l.lines, r.Message)
	l.count = append(l.count, n)
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

// counts returns the counts of the lines containing msg.
func (l *logLines) counts(msg string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int64
	for i, s := range l.lines {
		if strings.Contains(s, msg) {
			out = append(out, l.count[i])
		}
	}
	return out
}

// Floods of refusals — connections past the limit, failed TLS
// handshakes — are one log line per interval each, with their counts;
// the rest is logged when the server stops.
func TestRefusalsAreLoggedOncePerInterval(t *testing.T) {
	dir := t.TempDir()
	spec := cluster.Spec{Chief: []string{"127.0.0.1:1"}, PS: []string{"127.0.0.1:2"}, Worker: []string{"127.0.0.1:3"}}
	if _, err := certs.Generate(dir, spec, nil, certs.Options{}, false); err != nil {
		t.Fatal(err)
	}
	tc, err := tlsconf.Load(tlsconf.InDir(dir, cluster.Task{Type: cluster.PS, Index: 0}))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &logLines{}
	now := time.Unix(1000, 0) // a clock that stands still: every refusal is within one interval
	b := &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}
	s, addr, m := serveLimited(t, b, tls.NewListener(raw, tc.ServerTLS()), Config{Log: slog.New(logs), Now: func() time.Time { return now },
		Limits: Limits{MaxConns: 1, LogEvery: time.Hour}})
	// One plaintext client holds the only slot until its handshake
	// fails; meanwhile twenty more are refused.
	holder := dial(t, addr)
	eventually(t, "the first connection accepted", func() bool { return testutil.ToFloat64(m.DataPlaneConnections) == 1 })
	for range 20 {
		if c := dial(t, addr); !closedByPeer(c, 10*time.Second) {
			t.Fatal("a connection past the limit stayed open")
		}
	}
	holder.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	closedByPeer(holder, 10*time.Second)
	// Then twenty plaintext clients, one at a time, each failing its
	// handshake.
	for range 20 {
		c := dial(t, addr)
		c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		if !closedByPeer(c, 10*time.Second) {
			t.Fatal("a failed handshake left the connection open")
		}
	}
	eventually(t, "every refusal counted", func() bool { return closedFor(m, "limit") == 20 && closedFor(m, "tls") == 21 })
	if got := logs.counts("connection closed"); len(got) != 2 || got[0] != 1 || got[1] != 1 {
		t.Fatalf("lines while flooded: counts %v, want one line per reason, each for its first refusal", got)
	}
	s.Close()
	if got := logs.counts("connection closed"); len(got) != 4 || got[2]+got[3] != 19+20 {
		t.Fatalf("lines after the server stopped: counts %v, want the 19 and 20 suppressed ones in two more lines", got)
	}
}
