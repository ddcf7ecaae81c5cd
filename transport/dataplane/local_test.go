package dataplane

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	pb "github.com/pstrain/pstrain/proto"
)

func TestLocalNameOnlyForLoopbackIPs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("abstract Unix sockets are Linux's")
	}
	for addr, want := range map[string]string{
		"127.0.0.1:5000": "@pstrain-dataplane/127.0.0.1:5000",
		"127.0.0.2:80":   "@pstrain-dataplane/127.0.0.2:80",
		"[::1]:7":        "@pstrain-dataplane/[::1]:7",
		"localhost:5000": "", // a name is not resolved: stays on TCP
		"10.1.2.3:5000":  "",
		"[::]:5000":      "",
		"no-port":        "",
	} {
		if got := localName(addr); got != want {
			t.Errorf("localName(%q) = %q, want %q", addr, got, want)
		}
	}
}

// connNetwork is the network of c's connection after a call.
func connNetwork(t *testing.T, c *Client) string {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		t.Fatal("the client has no connection")
	}
	return c.conn.LocalAddr().Network()
}

func TestSameHostClientUsesTheUnixSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("abstract Unix sockets are Linux's")
	}
	b, addr := start(t, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	if _, err := c.Push(context.Background(), &pb.PushRequest{Worker: 1, Grad: make([]byte, 400), RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	if n := connNetwork(t, c); n != localNetwork {
		t.Fatalf("a client of %s talks over %q, want %q", addr, n, localNetwork)
	}
	pr, err := c.Pull(context.Background(), &pb.PullRequest{RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	pushes := b.pushes
	b.mu.Unlock()
	if string(pr.Params) != "params-r" || pushes != 1 {
		t.Fatalf("over the Unix socket: pull %q, %d pushes", pr.Params, pushes)
	}
}

// wrapped hides the TCP listener's type, as a TLS or limiting wrapper does.
type wrapped struct{ net.Listener }

func TestClientFallsBackToTCPWithoutUnixSocket(t *testing.T) {
	b := &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(b, wrapped{lis}, Config{MaxPayload: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if s.local != nil {
		t.Fatal("a server behind a listener wrapper opened a Unix socket beside it (it would bypass the wrapper)")
	}
	go s.Serve()
	defer s.Close()
	c := client(lis.Addr().String(), 1<<20)
	defer c.Close()
	if _, err := c.Pull(context.Background(), &pb.PullRequest{RunId: "r"}); err != nil {
		t.Fatal(err)
	}
	if n := connNetwork(t, c); n != "tcp" {
		t.Fatalf("without a Unix socket the client talks over %q, want tcp", n)
	}
}

func TestCloseClosesTheUnixSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("abstract Unix sockets are Linux's")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(&fakeBackend{}, lis, Config{MaxPayload: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	name := localName(lis.Addr().String())
	conn, err := net.Dial(localNetwork, name)
	if err != nil {
		t.Fatalf("dial %s while serving: %v", name, err)
	}
	conn.Close()
	s.Close()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if conn, err := net.Dial(localNetwork, name); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Close", name)
	}
}

// nowBackend answers pulls of version 0 at once through PullSharedNow.
type nowBackend struct {
	*fakeBackend
	now int // pulls answered by PullSharedNow
}

func (b *nowBackend) PullSharedNow(r *pb.PullRequest) (*pb.PullResponse, func(), bool, error) {
	if r.MinVersion > 0 {
		return nil, nil, false, nil
	}
	resp, release, err := b.fakeBackend.PullShared(context.Background(), r)
	b.mu.Lock()
	b.now++
	b.mu.Unlock()
	return resp, release, true, err
}

func TestServerAnswersReadyPullsAtOnce(t *testing.T) {
	b := &nowBackend{fakeBackend: &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(b, lis, Config{MaxPayload: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	go s.Serve()
	defer s.Close()
	c := client(lis.Addr().String(), 1<<20)
	defer c.Close()
	ctx := context.Background()
	if pr, err := c.Pull(ctx, &pb.PullRequest{RunId: "r"}); err != nil || string(pr.Params) != "params-r" {
		t.Fatalf("a ready pull: %v %v", pr, err)
	}
	// A pull that waits takes the blocking path, and is answered when
	// the backend is ready.
	done := make(chan error, 1)
	go func() {
		_, err := c.Pull(ctx, &pb.PullRequest{RunId: "r", MinVersion: 3})
		done <- err
	}()
	<-b.pullCtx
	b.release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The server releases a pull's parameters after writing them, or,
	// when it answered in a shared slot (snapshots.go), at the
	// connection's next request or its end: the client may have read
	// them a moment before.
	c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		now, held, released := b.now, b.held, b.released
		b.mu.Unlock()
		if released == 2 || time.Now().After(deadline) {
			if now != 1 || held != 0 || released != 2 {
				t.Fatalf("answered at once %d (want 1), held %d (want 0), released %d (want 2)", now, held, released)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// A same-host connection is used only with a peer of this process's user
// (SO_PEERCRED): the server here is this process.
func TestPeerIsUsOnOwnSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("abstract Unix sockets are Linux's")
	}
	lis, err := net.Listen(localNetwork, "@pstrain-dataplane-test/"+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		if c, err := lis.Accept(); err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	c, err := net.Dial(localNetwork, lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !peerIsUs(c) {
		t.Fatal("a connection to this process's own socket: peer not recognised as this user")
	}
	if peerIsUser(c, os.Geteuid()+1) {
		t.Fatal("the peer passed the check for another user's uid")
	}
	tc, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	go func() {
		if c, err := tc.Accept(); err == nil {
			c.Close()
		}
	}()
	cc, err := net.Dial("tcp", tc.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if peerIsUs(cc) {
		t.Fatal("a TCP connection passed the Unix peer check")
	}
}
