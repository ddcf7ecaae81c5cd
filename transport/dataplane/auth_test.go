package dataplane

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
)

// startAuth is start with a server that requires sessions of keys (nil:
// none) and returns the refusal counts by reason.
func startAuth(t testing.TB, b Backend, keys *auth.Keyring, maxPayload int) (addr string, reasons func() map[string]int) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.NewPS(reg)
	s := NewServer(b, lis, Config{MaxPayload: maxPayload, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: m, Auth: keys})
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() { s.Close(); <-done })
	return lis.Addr().String(), func() map[string]int {
		out := map[string]int{}
		for _, r := range []string{auth.ReasonNoCredential, auth.ReasonBadCredential, auth.ReasonForbidden, auth.ReasonCertificate} {
			if n := int(testutil.ToFloat64(m.RejectedRequests.WithLabelValues(r))); n > 0 {
				out[r] = n
			}
		}
		return out
	}
}

func signed(addr string, keys *auth.Keyring, role string, index int, maxPayload int) *Client {
	who := &auth.Client{Keys: keys, Role: role, Index: index}
	who.SetSession(uint64(1000 + index))
	c := client(addr, maxPayload)
	c.SignWith(who)
	return c
}

// TestServerRequiresASession: with a keyring, only a frame signed by a
// session of the run whose identity may make the request reaches the
// backend; every other is refused with the right code and reason.
func TestServerRequiresASession(t *testing.T) {
	b := &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}
	keys := auth.NewKeyring(auth.Token("the run's token, thirty-two bytes or more"))
	other := auth.NewKeyring(auth.Token("another run's token, also long enough...."))
	addr, reasons := startAuth(t, b, keys, 1<<20)
	ctx := context.Background()
	grad := make([]byte, 64)

	w0 := signed(addr, keys, auth.RoleWorker, 0, 1<<20)
	defer w0.Close()
	if _, err := w0.Push(ctx, &pb.PushRequest{Worker: 0, Grad: grad, RunId: "r"}); err != nil {
		t.Fatalf("worker/0 pushing as itself: %v", err)
	}
	if _, err := w0.Pull(ctx, &pb.PullRequest{Worker: 0, RunId: "r"}); err != nil {
		t.Fatalf("worker/0 pulling as itself: %v", err)
	}
	chief := signed(addr, keys, auth.RoleChief, 0, 1<<20)
	defer chief.Close()
	if _, err := chief.Pull(ctx, &pb.PullRequest{Worker: -1, RunId: "r"}); err != nil {
		t.Fatalf("the chief's evaluation pull: %v", err)
	}

	refused := []struct {
		name string
		c    *Client
		push bool
		code codes.Code
	}{
		{"unsigned push", client(addr, 1<<20), true, codes.Unauthenticated},
		{"unsigned pull", client(addr, 1<<20), false, codes.Unauthenticated},
		{"another run's token", signed(addr, other, auth.RoleWorker, 0, 1<<20), true, codes.Unauthenticated},
		{"worker/1 as worker 0", signed(addr, keys, auth.RoleWorker, 1, 1<<20), true, codes.PermissionDenied},
		{"the chief pushing", signed(addr, keys, auth.RoleChief, 0, 1<<20), true, codes.PermissionDenied},
		{"a ps pulling", signed(addr, keys, auth.RolePS, 0, 1<<20), false, codes.PermissionDenied},
	}
	for _, r := range refused {
		var err error
		if r.push {
			_, err = r.c.Push(ctx, &pb.PushRequest{Worker: 0, Grad: grad, RunId: "r"})
		} else {
			_, err = r.c.Pull(ctx, &pb.PullRequest{Worker: 0, RunId: "r"})
		}
		if status.Code(err) != r.code {
			t.Errorf("%s: %v, want %v", r.name, err, r.code)
		}
		r.c.Close()
	}
	// A refused push whose payload is still on its way: the refusal, not
	// a reset connection (which the worker would retry as Unavailable).
	big := make([]byte, 5<<20)
	for _, r := range []struct {
		c    *Client
		code codes.Code
	}{{signed(addr, other, auth.RoleWorker, 0, 1<<20), codes.Unauthenticated}, {signed(addr, keys, auth.RoleWorker, 1, 1<<20), codes.PermissionDenied}} {
		if _, err := r.c.Push(ctx, &pb.PushRequest{Worker: 0, Grad: big, RunId: "r"}); status.Code(err) != r.code {
			t.Errorf("a refused 5 MiB push: %v, want %v", err, r.code)
		}
		r.c.Close()
	}
	b.mu.Lock()
	pushes := b.pushes
	b.mu.Unlock()
	if pushes != 1 {
		t.Errorf("%d pushes reached the backend, want 1 (the signed one)", pushes)
	}
	want := map[string]int{auth.ReasonNoCredential: 2, auth.ReasonBadCredential: 2, auth.ReasonForbidden: 4}
	got := reasons()
	for r, n := range want {
		if got[r] != n {
			t.Errorf("refusals %v, want %v", got, want)
			break
		}
	}
}

// bigBackend answers pulls with a fixed payload and accepts pushes.
type bigBackend struct{ params []byte }

func (f *bigBackend) PullShared(context.Context, *pb.PullRequest) (*pb.PullResponse, func(), error) {
	return &pb.PullResponse{Params: f.params}, func() {}, nil
}

func (f *bigBackend) Push(context.Context, *pb.PushRequest) (*pb.PushResponse, error) {
	return &pb.PushResponse{}, nil
}

// BenchmarkAuthCost: a push and a pull of one default shard (318,405
// float32s, 1.27 MB, as in a 2-PS MLP 784-800-10) per op, over
// loopback, signed and unsigned alternately within one run; reports the
// median signed/unsigned ratio of the pairs, the cost of authentication
// on the data plane.
//
//	go test -run XXX -bench AuthCost -benchtime 200x ./transport/dataplane
func BenchmarkAuthCost(b *testing.B) {
	const n = 318405 * 4
	keys := auth.NewKeyring(auth.Token("the run's token, thirty-two bytes or more"))
	back := &bigBackend{params: make([]byte, n)}
	plainAddr, _ := startAuth(b, back, nil, 2*n)
	authAddr, _ := startAuth(b, back, keys, 2*n)
	plain := client(plainAddr, 2*n)
	defer plain.Close()
	sig := signed(authAddr, keys, auth.RoleWorker, 0, 2*n)
	defer sig.Close()
	grad := make([]byte, n)
	ctx := context.Background()
	step := func(c *Client) time.Duration {
		start := time.Now()
		if _, err := c.Push(ctx, &pb.PushRequest{Worker: 0, Grad: grad, RunId: "r"}); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Pull(ctx, &pb.PullRequest{Worker: 0, RunId: "r"}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	step(plain)
	step(sig)
	// The median of per-iteration ratios: a burst of load from other
	// processes skews a pair, not the median.
	ratios := make([]float64, 0, b.N)
	var tPlain, tSigned time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var p, s time.Duration
		if i%2 == 0 {
			p = step(plain)
			s = step(sig)
		} else {
			s = step(sig)
			p = step(plain)
		}
		tPlain += p
		tSigned += s
		ratios = append(ratios, float64(s)/float64(p))
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "signed/unsigned")
	b.ReportMetric(float64(tSigned.Microseconds())/float64(b.N), "signed-µs/op")
	b.ReportMetric(float64(tPlain.Microseconds())/float64(b.N), "unsigned-µs/op")
}
