package dataplane

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
)

// fakeBackend answers pushes by echoing their sum into the version, and
// blocks pulls for min_version > 0 until released or cancelled.
type fakeBackend struct {
	mu       sync.Mutex
	pushes   int
	lastGrad []byte
	held     int // pulls answered and not yet released
	released int
	retains  int // pulls with retain set
	// lastDataPos is the last push's data position.
	lastDataPos int64
	release     chan struct{}
	pullCtx     chan context.Context
}

func (f *fakeBackend) PullShared(ctx context.Context, r *pb.PullRequest) (*pb.PullResponse, func(), error) {
	if r.RunId == "bad" {
		return nil, nil, status.Error(codes.FailedPrecondition, "request for run \"bad\"")
	}
	if r.MinVersion > 0 {
		f.pullCtx <- ctx
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	f.mu.Lock()
	f.held++
	if r.Retain {
		f.retains++
	}
	f.mu.Unlock()
	done := func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.held--
		f.released++
	}
	return &pb.PullResponse{Version: r.MinVersion, Params: []byte("params-" + r.RunId), Done: r.Worker == 7, Generation: r.Generation + 1,
		DataPosition: 1000 + int64(r.Worker)}, done, nil
}

func (f *fakeBackend) Push(_ context.Context, r *pb.PushRequest) (*pb.PushResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pushes++
	f.lastGrad = append(f.lastGrad[:0], r.Grad...)
	f.lastDataPos = r.DataPosition
	if len(r.Grad)%4 != 0 {
		return nil, status.Error(codes.InvalidArgument, "gradient length is not a multiple of 4")
	}
	return &pb.PushResponse{Outcome: pb.PushResponse_DUPLICATE, Version: r.Version + int64(len(r.Grad)), Done: r.Loss > 1}, nil
}

func start(t *testing.T, maxPayload int) (*fakeBackend, string) {
	t.Helper()
	b := &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(b, lis, Config{MaxPayload: maxPayload, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	serveTest(t, s)
	return b, lis.Addr().String()
}

func client(addr string, maxPayload int) *Client {
	return NewClient(func(context.Context) (string, error) { return addr, nil }, nil, maxPayload)
}

func TestPushAndPullRoundTrip(t *testing.T) {
	b, addr := start(t, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	ctx := context.Background()
	grad := bytes.Repeat([]byte{1, 2, 3, 4}, 1000)
	resp, err := c.Push(ctx, &pb.PushRequest{Worker: 3, Version: 10, Grad: grad, RunId: "r1", Loss: 2, Generation: 4, DataPosition: 77})
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	pos := b.lastDataPos
	b.mu.Unlock()
	if pos != 77 {
		t.Fatalf("the server got data position %d, want 77", pos)
	}
	if resp.Outcome != pb.PushResponse_DUPLICATE || resp.Version != 4010 || !resp.Done {
		t.Fatalf("push response %+v", resp)
	}
	b.mu.Lock()
	same := bytes.Equal(b.lastGrad, grad)
	b.mu.Unlock()
	if !same {
		t.Fatal("the server got a different gradient")
	}
	pr, err := c.Pull(ctx, &pb.PullRequest{Worker: 7, RunId: "r1", Generation: 2, Retain: true})
	if err != nil {
		t.Fatal(err)
	}
	if string(pr.Params) != "params-r1" || !pr.Done || pr.Generation != 3 || pr.DataPosition != 1007 {
		t.Fatalf("pull response %+v", pr)
	}
	b.mu.Lock()
	retains := b.retains
	b.mu.Unlock()
	if retains != 1 {
		t.Fatalf("the server saw %d pulls with retain set, want 1", retains)
	}
	// Errors keep their status code and the connection.
	if _, err := c.Pull(ctx, &pb.PullRequest{RunId: "bad"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a refused pull: %v", err)
	}
	if _, err := c.Push(ctx, &pb.PushRequest{Grad: []byte{1, 2, 3}, RunId: "r1"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a refused push: %v", err)
	}
	if _, err := c.Pull(ctx, &pb.PullRequest{RunId: "r1"}); err != nil {
		t.Fatalf("after errors: %v", err)
	}
	// The server handles a connection's requests in order and releases a
	// pull's parameters once written, so after one more request both
	// successful pulls have released theirs, and the refused one none.
	if _, err := c.Push(ctx, &pb.PushRequest{Grad: grad, RunId: "r1"}); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	held, released := b.held, b.released
	b.mu.Unlock()
	if held != 0 || released != 2 {
		t.Fatalf("pulls holding parameters %d, released %d; want 0 and 2", held, released)
	}
}

func TestCancelledPullReleasesTheServer(t *testing.T) {
	b, addr := start(t, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, &pb.PullRequest{MinVersion: 5, RunId: "r"})
		errc <- err
	}()
	serverCtx := <-b.pullCtx // the pull is blocked on the server
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled pull: %v, want Canceled", err)
	}
	// The client closed its connection; the server's pull is cancelled
	// too instead of blocking forever.
	select {
	case <-serverCtx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the server's pull was not cancelled when the client went away")
	}
	// The client reconnects for the next call.
	if _, err := c.Pull(context.Background(), &pb.PullRequest{RunId: "r"}); err != nil {
		t.Fatalf("after a cancelled pull: %v", err)
	}
}

func TestDeadlineAndUnavailable(t *testing.T) {
	b, addr := start(t, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Pull(ctx, &pb.PullRequest{MinVersion: 1, RunId: "r"})
	<-b.pullCtx
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("pull past its deadline: %v", err)
	}
	// Nobody listening: Unavailable, which the worker retries.
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := lis.Addr().String()
	lis.Close()
	d := client(dead, 1<<20)
	if _, err := d.Pull(context.Background(), &pb.PullRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("no server: %v, want Unavailable", err)
	}
	// No data plane on the PS: a clear error.
	e := NewClient(func(context.Context) (string, error) { return "", nil }, nil, 1<<20)
	if _, err := e.Pull(context.Background(), &pb.PullRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("PS without data plane: %v", err)
	}
}

// TestBadFramesAreRejected sends malformed requests on raw connections:
// each gets an InvalidArgument answer (or the connection closed) and the
// server keeps serving others.
func TestBadFramesAreRejected(t *testing.T) {
	b, addr := start(t, 1024)
	good := appendSigned(nil, request{op: opPush, runID: "r", payloadLen: 4}, nil)
	cases := map[string][]byte{
		"bad magic":        append([]byte("HTTP"), good[4:]...),
		"unknown op":       append(append([]byte{}, good[:4]...), append([]byte{9}, good[5:]...)...),
		"too large":        appendSigned(nil, request{op: opPush, runID: "r", payloadLen: 4096}, nil),
		"pull payload":     appendSigned(nil, request{op: opPull, runID: "r", payloadLen: 8}, nil),
		"push retain":      appendSigned(nil, request{op: opPush, retain: true, runID: "r", payloadLen: 4}, nil),
		"replicate retain": appendSigned(nil, request{op: opReplicate, retain: true, runID: "r", dataPos: 1, payloadLen: 5}, nil),
		"unknown flag":     append(append([]byte{}, good[:5]...), append([]byte{0x80}, good[6:]...)...),
		"old format":       append([]byte("PSD1"), good[4:]...),
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := conn.Write(frame); err != nil {
				t.Fatal(err)
			}
			resp, err := readResponse(conn, make([]byte, respLen), 1<<20)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			if codes.Code(resp.code) != codes.InvalidArgument {
				t.Fatalf("code %v, want InvalidArgument", codes.Code(resp.code))
			}
			msg := make([]byte, resp.payloadLen)
			io.ReadFull(conn, msg)
			// Then the server hangs up.
			if _, err := conn.Read(make([]byte, 1)); err == nil {
				t.Fatal("the connection stayed open after a bad frame")
			}
		})
	}
	b.mu.Lock()
	pushes := b.pushes
	b.mu.Unlock()
	if pushes != 0 {
		t.Fatalf("%d bad frames reached the backend", pushes)
	}
	c := client(addr, 1024)
	defer c.Close()
	if _, err := c.Push(context.Background(), &pb.PushRequest{Grad: []byte{0, 0, 0, 0}, RunId: "r"}); err != nil {
		t.Fatalf("a good client after bad frames: %v", err)
	}
	// A response larger than the client's limit is refused too.
	small := client(addr, 4)
	defer small.Close()
	if _, err := small.Pull(context.Background(), &pb.PullRequest{RunId: "rrrr"}); status.Code(err) != codes.Internal {
		t.Fatalf("oversized response: %v, want Internal", err)
	}
}

func TestVectoredPushAndPull(t *testing.T) {
	b, addr := start(t, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	ctx := context.Background()
	segs := [][]float32{{1, 2, 3}, {4}, {5, 6}}
	if _, err := c.PushSegments(ctx, &pb.PushRequest{RunId: "r"}, segs); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	got := append([]byte(nil), b.lastGrad...)
	b.mu.Unlock()
	var want []byte
	for _, s := range segs {
		for _, x := range s {
			want = binary.LittleEndian.AppendUint32(want, math.Float32bits(x))
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("pushed %v, want %v", got, want)
	}
	// The fake answers pulls with "params-" + run id: 12 bytes for "abcde".
	dst := [][]float32{make([]float32, 1), make([]float32, 2)}
	resp, err := c.PullInto(ctx, &pb.PullRequest{RunId: "abcde"}, dst)
	if err != nil || resp.Params != nil {
		t.Fatalf("PullInto: %v, params %q", err, resp.Params)
	}
	raw := []byte("params-abcde")
	for i, x := range append(dst[0], dst[1]...) {
		if math.Float32bits(x) != binary.LittleEndian.Uint32(raw[4*i:]) {
			t.Fatalf("value %d read wrongly", i)
		}
	}
	// A size mismatch leaves dst alone and returns what was sent.
	small := [][]float32{make([]float32, 1)}
	resp, err = c.PullInto(ctx, &pb.PullRequest{RunId: "abcde"}, small)
	if err != nil || string(resp.Params) != "params-abcde" || small[0][0] != 0 {
		t.Fatalf("mismatched PullInto: %v %q %v", err, resp.Params, small)
	}
}

// serveTest serves s until the test ends, then closes it and checks that
// Serve returned cleanly.
func serveTest(t testing.TB, s *Server) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}
