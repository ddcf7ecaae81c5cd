//go:build linux

package dataplane

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/wire"
)

// echoBackend answers a pull with the last push's gradient (or params
// before any push) and records every push it gets.
type echoBackend struct {
	mu     sync.Mutex
	params []byte
	pushes int
}

func (e *echoBackend) PullShared(context.Context, *pb.PullRequest) (*pb.PullResponse, func(), error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return &pb.PullResponse{Version: int64(e.pushes), Params: e.params}, func() {}, nil
}

func (e *echoBackend) Push(_ context.Context, r *pb.PushRequest) (*pb.PushResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.params = append([]byte(nil), r.Grad...)
	e.pushes++
	return &pb.PushResponse{Version: int64(e.pushes)}, nil
}

func (e *echoBackend) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pushes
}

// serveShm starts a server for b on a loopback address after setup has
// seen it.
func serveShm(t testing.TB, b Backend, cfg Config, setup func(*Server)) (*Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = 8 << 20
	}
	s := NewServer(b, lis, cfg)
	if setup != nil {
		setup(s)
	}
	serveTest(t, s)
	return s, lis.Addr().String()
}

// clientShm is c's region (nil: none) and whether it gave up offering.
func clientShm(c *Client) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shm, c.noShm
}

// segments returns n random floats cut into three segments.
func segments(r *rand.Rand, n int) [][]float32 {
	all := make([]float32, n)
	for i := range all {
		all[i] = float32(r.NormFloat64())
	}
	return [][]float32{all[:n/3], all[n/3 : n/2], all[n/2:]}
}

func flat(segs [][]float32) []byte {
	var b []byte
	for _, s := range segs {
		b = append(b, wire.Bytes(s)...)
	}
	return b
}

// exchangeAll pushes and pulls through c as a worker does, and returns
// what the server got and what the client pulled: into dst, and with a
// plain Pull.
func exchangeAll(t *testing.T, c *Client, e *echoBackend, n int) (pushed, pulledInto, pulled []byte) {
	t.Helper()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	segs := segments(r, n)
	dst := [][]float32{make([]float32, n/4), make([]float32, n-n/4)}
	// A first pull before any push knows its size from dst.
	if _, err := c.PullInto(ctx, &pb.PullRequest{RunId: "r"}, dst); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PushSegments(ctx, &pb.PushRequest{RunId: "r"}, segs); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	pushed = append([]byte(nil), e.params...)
	e.mu.Unlock()
	resp, err := c.PullInto(ctx, &pb.PullRequest{RunId: "r"}, dst)
	if err != nil || resp.Params != nil {
		t.Fatalf("PullInto: %v, %d bytes not scattered", err, len(resp.Params))
	}
	pulledInto = flat(dst)
	pr, err := c.Pull(ctx, &pb.PullRequest{RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pushed, flat(segs)) {
		t.Fatal("the server got another gradient than was pushed")
	}
	return pushed, pulledInto, append([]byte(nil), pr.Params...)
}

// A worker's pushes and pulls through shared memory give exactly what
// they give through the socket, and a server with shared memory off
// makes the client carry them on the socket.
func TestSharedMemoryMatchesTheSocket(t *testing.T) {
	const n = 400_000 // 1.6 MB: more than the smallest region
	var results [2][3][]byte
	for i, off := range []bool{false, true} {
		e := &echoBackend{params: make([]byte, 4*n)}
		s, addr := serveShm(t, e, Config{NoSharedMemory: off}, nil)
		c := client(addr, 8<<20)
		pushed, into, pulled := exchangeAll(t, c, e, n)
		results[i] = [3][]byte{pushed, into, pulled}
		shm, gaveUp := clientShm(c)
		if off {
			if shm != nil || !gaveUp || s.regions.Load() != 0 || s.inShm.Load() != 0 {
				t.Fatalf("shared memory off: client region %d bytes, gave up %v, server regions %d, payloads in one %d", len(shm), gaveUp, s.regions.Load(), s.inShm.Load())
			}
		} else if len(shm) < 4*n || s.regions.Load() != 1 {
			t.Fatalf("client region %d bytes, server regions %d; want a region of at least %d bytes", len(shm), s.regions.Load(), 4*n)
		} else if got := s.inShm.Load(); got != 4 {
			// exchangeAll's two pulls into dst, its push and its plain
			// pull: the first connection's region held them all (sized
			// from dst).
			t.Fatalf("%d payloads went through the region, want 4", got)
		}
		if n := connNetwork(t, c); n != localNetwork {
			t.Fatalf("network %q", n)
		}
		c.Close()
	}
	for k, what := range []string{"pushed", "pulled into dst", "pulled"} {
		if !bytes.Equal(results[0][k], results[1][k]) {
			t.Errorf("%s through shared memory differs from the socket's", what)
		}
	}
}

// A plain Pull (no dst) larger than the region comes on the socket; the
// client then connects again with a region that holds it.
func TestRegionGrowsToTheLargestPayload(t *testing.T) {
	const size = 3 << 20
	e := &echoBackend{params: bytes.Repeat([]byte{7}, size)}
	_, addr := serveShm(t, e, Config{}, noSnapshots)
	c := client(addr, 8<<20)
	defer c.Close()
	ctx := context.Background()
	for i := range 2 {
		pr, err := c.Pull(ctx, &pb.PullRequest{RunId: "r"})
		if err != nil || !bytes.Equal(pr.Params, e.params) {
			t.Fatalf("pull %d: %v", i, err)
		}
	}
	if shm, _ := clientShm(c); len(shm) < size {
		t.Fatalf("region of %d bytes after pulls of %d", len(shm), size)
	}
}

// A server of an earlier build refuses the preamble as a bad frame and
// closes the connection: the client connects again and carries its
// payloads on the socket.
func TestClientFallsBackOnAServerWithoutSharedMemory(t *testing.T) {
	e := &echoBackend{}
	_, addr := serveShm(t, e, Config{}, func(s *Server) { s.noPreamble = true })
	c := client(addr, 8<<20)
	defer c.Close()
	grad := bytes.Repeat([]byte{1, 2, 3, 4}, 1000)
	if _, err := c.Push(context.Background(), &pb.PushRequest{RunId: "r", Grad: grad}); err != nil {
		t.Fatal(err)
	}
	pr, err := c.Pull(context.Background(), &pb.PullRequest{RunId: "r"})
	if err != nil || !bytes.Equal(pr.Params, grad) {
		t.Fatalf("pull: %v", err)
	}
	if shm, gaveUp := clientShm(c); shm != nil || !gaveUp || connNetwork(t, c) != localNetwork {
		t.Fatalf("region %d bytes, gave up %v", len(shm), gaveUp)
	}
}

// A region from a process of another user is refused; the connection
// goes on with payloads on the socket.
func TestRegionFromAnotherUserIsRefused(t *testing.T) {
	e := &echoBackend{}
	s, addr := serveShm(t, e, Config{}, func(s *Server) { s.uid = os.Geteuid() + 1 })
	conn := dialUnix(t, addr)
	mem, _, st, err := offerRegion(conn, minRegion, deadline())
	if err != nil || mem != nil || st != regionForeign {
		t.Fatalf("offer from another user: region %v, status %d, %v; want status %d", mem != nil, st, err, regionForeign)
	}
	c := client(addr, 8<<20)
	defer c.Close()
	if _, err := c.Push(context.Background(), &pb.PushRequest{RunId: "r", Grad: make([]byte, 64)}); err != nil {
		t.Fatal(err)
	}
	if shm, gaveUp := clientShm(c); shm != nil || !gaveUp || s.regions.Load() != 0 {
		t.Fatalf("region %d bytes, gave up %v, server regions %d", len(shm), gaveUp, s.regions.Load())
	}
}

func dialUnix(t *testing.T, addr string) *net.UnixConn {
	t.Helper()
	conn, err := net.Dial(localNetwork, localName(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn.(*net.UnixConn)
}

func deadline() time.Time { return time.Now().Add(10 * time.Second) }

// offerFD sends a preamble announcing size with fd attached and returns
// the server's status.
func offerFD(t *testing.T, conn *net.UnixConn, fd, size int) byte {
	t.Helper()
	var rights []byte
	if fd >= 0 {
		rights = unix.UnixRights(fd)
	}
	if _, _, err := conn.WriteMsgUnix(appendPreamble(nil, size), rights, nil); err != nil {
		t.Fatal(err)
	}
	var ack [ackLen]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil || [4]byte(ack[:4]) != preambleMagic {
		t.Fatalf("ack %q: %v", ack, err)
	}
	return ack[4]
}

// memfd returns a memfd of size bytes with seals.
func memfd(t *testing.T, size int, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// Only a memfd sealed against resizing, of the size announced, within
// the payload limit, is mapped; every other offer is refused, and the
// connection still serves frames with payloads on the socket.
func TestUnfitRegionsAreRefused(t *testing.T) {
	e := &echoBackend{}
	s, addr := serveShm(t, e, Config{MaxPayload: 4 << 20}, nil)
	file, err := os.CreateTemp(t.TempDir(), "region")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	file.Truncate(minRegion)
	for _, tc := range []struct {
		what string
		fd   int
		size int
	}{
		{"unsealed", memfd(t, minRegion, 0), minRegion},
		{"growable only", memfd(t, minRegion, unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL), minRegion},
		{"shrinkable", memfd(t, minRegion, unix.F_SEAL_GROW|unix.F_SEAL_SEAL), minRegion},
		{"smaller than announced", memfd(t, 4096, regionSeals), minRegion},
		{"larger than a payload", memfd(t, 16<<20, regionSeals), 16 << 20},
		{"empty", memfd(t, 0, regionSeals), 0},
		{"a file, not a memfd", int(file.Fd()), minRegion},
		{"no descriptor", -1, minRegion},
	} {
		conn := dialUnix(t, addr)
		if st := offerFD(t, conn, tc.fd, tc.size); st != regionRefused {
			t.Errorf("%s: status %d, want %d (refused)", tc.what, st, regionRefused)
			continue
		}
		// The connection goes on without a region.
		req := appendSigned(nil, request{op: opPush, runID: "r", payloadLen: 8}, nil)
		if _, err := conn.Write(append(req, make([]byte, 8)...)); err != nil {
			t.Fatal(err)
		}
		resp, err := readResponse(conn, make([]byte, respLen), 1<<20)
		if err != nil || resp.code != 0 {
			t.Fatalf("%s: a push after the refusal: %v, code %d", tc.what, err, resp.code)
		}
	}
	if s.regions.Load() != 0 {
		t.Fatalf("%d regions mapped", s.regions.Load())
	}
	// A well-formed one is taken.
	if st := offerFD(t, dialUnix(t, addr), memfd(t, minRegion, regionSeals), minRegion); st != regionAccepted {
		t.Fatalf("a sealed memfd: status %d", st)
	}
}

// A frame naming more of the region than there is, or the region on a
// connection without one, is refused before anything is applied.
func TestRegionBoundsAreChecked(t *testing.T) {
	e := &echoBackend{}
	_, addr := serveShm(t, e, Config{}, nil)
	for _, tc := range []struct {
		what   string
		region bool
		req    request
		want   string
	}{
		{"push past the region", true, request{op: opPush, shm: true, runID: "r", payloadLen: minRegion + 4}, "in a shared region of"},
		{"push without a region", false, request{op: opPush, shm: true, runID: "r", payloadLen: 8}, "without a shared region"},
		{"pull without a region", false, request{op: opPull, shm: true, runID: "r"}, "without a shared region"},
	} {
		conn := dialUnix(t, addr)
		if tc.region {
			mem, _, st, err := offerRegion(conn, minRegion, deadline())
			if err != nil || mem == nil {
				t.Fatalf("offer: status %d, %v", st, err)
			}
			defer unmap(mem)
		}
		if _, err := conn.Write(appendSigned(nil, tc.req, nil)); err != nil {
			t.Fatal(err)
		}
		resp, err := readResponse(conn, make([]byte, respLen), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, resp.payloadLen)
		io.ReadFull(conn, msg)
		if codes.Code(resp.code) != codes.InvalidArgument || !strings.Contains(string(msg), tc.want) {
			t.Errorf("%s: code %v %q, want InvalidArgument naming %q", tc.what, codes.Code(resp.code), msg, tc.want)
		}
	}
	if e.count() != 0 {
		t.Fatalf("%d pushes applied", e.count())
	}
}

// A response that puts more in the region than there is, or that the
// request did not ask for, is a malformed frame to the client.
func TestClientChecksTheRegionsBounds(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0") // holds the address whose socket we serve
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	addr := lis.Addr().String()
	ul, err := net.Listen(localNetwork, localName(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	go func() {
		for {
			c, err := ul.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var pre [preambleLen]byte
				oob := make([]byte, 64)
				n, oobn, _, _, _ := c.(*net.UnixConn).ReadMsgUnix(pre[:], oob)
				for _, fd := range receivedFDs(oob[:oobn]) {
					unix.Close(fd)
				}
				if n != preambleLen {
					return
				}
				c.Write(appendAck(nil, regionAccepted))
				req, err := readRequest(c, make([]byte, 512), 1<<20)
				if err != nil {
					return
				}
				c.Write(appendResponse(nil, response{shm: true, payloadLen: uint32(minRegion + 4*int(req.worker))}))
			}()
		}
	}()
	for _, worker := range []int32{1, 0} { // 1: past the region; 0: a push answered in the region
		c := client(addr, 8<<20)
		var err error
		if worker == 1 {
			_, err = c.Pull(context.Background(), &pb.PullRequest{Worker: worker, RunId: "r"})
		} else {
			_, err = c.Push(context.Background(), &pb.PushRequest{Worker: worker, RunId: "r", Grad: make([]byte, 8)})
		}
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), ErrBadFrame.Error()) {
			t.Errorf("worker %d: %v, want Internal, a malformed frame", worker, err)
		}
		c.Close()
	}
}

// mappedRegions counts this process's mappings of data-plane regions
// and of snapshot regions (snapshots.go).
func mappedRegions(t *testing.T) (regions, snaps int) {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(maps), "memfd:"+regionName), strings.Count(string(maps), "memfd:"+snapsName)
}

// noSnapshots makes s answer every pull in its connection's region, as
// a server without shared answers does.
func noSnapshots(s *Server) {
	closeSnapshots(s.snaps, s.snapFD)
	s.snaps = nil
}

// Every region is unmapped when its connection ends: the client's when
// it closes, the server's when the client goes and when the server
// closes.
func TestRegionsAreUnmapped(t *testing.T) {
	before, beforeSnaps := mappedRegions(t)
	e := &echoBackend{}
	s, addr := serveShm(t, e, Config{}, nil)
	c1, c2 := client(addr, 8<<20), client(addr, 8<<20)
	for _, c := range []*Client{c1, c2} {
		if _, err := c.Push(context.Background(), &pb.PushRequest{RunId: "r", Grad: make([]byte, 8)}); err != nil {
			t.Fatal(err)
		}
	}
	got, gotSnaps := mappedRegions(t)
	if got-before != 4 || gotSnaps-beforeSnaps != 3 || s.regions.Load() != 2 {
		t.Fatalf("%d mappings, %d of snapshots, server has %d regions; want 4 (client and server for two connections), 3 (the server's, each client's), 2",
			got-before, gotSnaps-beforeSnaps, s.regions.Load())
	}
	c1.Close()
	eventually(t, "the server unmaps a closed connection's region", func() bool { return s.regions.Load() == 1 })
	s.Close()
	if s.regions.Load() != 0 {
		t.Fatalf("%d regions mapped after Close", s.regions.Load())
	}
	c2.Close()
	if got, gotSnaps := mappedRegions(t); got != before || gotSnaps != beforeSnaps {
		t.Fatalf("%d mappings left, %d of snapshots", got-before, gotSnaps-beforeSnaps)
	}
}

// A preamble begun and left unfinished (fewer bytes than its magic) is
// held to FrameGrace, as a started header is, not to IdleTimeout.
func TestUnfinishedPreambleIsCut(t *testing.T) {
	e := &echoBackend{}
	_, addr := serveShm(t, e, Config{Limits: Limits{IdleTimeout: time.Minute, FrameGrace: 100 * time.Millisecond}}, nil)
	conn := dialUnix(t, addr)
	defer conn.Close()
	if _, err := conn.Write([]byte("PS")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatalf("reading until the server closes: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the server held an unfinished preamble for %v", took)
	}
}

// A same-user connection that sends nothing is cut when IdleTimeout
// passes, and the server goes on serving: the failed read of the
// preamble (recvmsg's -1) once crashed it.
func TestSilentLocalConnectionIsCutAndTheServerLives(t *testing.T) {
	e := &echoBackend{}
	_, addr := serveShm(t, e, Config{Limits: Limits{IdleTimeout: 100 * time.Millisecond, FrameGrace: 100 * time.Millisecond}}, nil)
	for range 3 {
		conn := dialUnix(t, addr)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadAll(conn); err != nil {
			t.Fatalf("reading until the server closes the silent connection: %v", err)
		}
		conn.Close()
	}
	c := client(addr, 8<<20)
	defer c.Close()
	if _, err := c.Push(context.Background(), &pb.PushRequest{Grad: make([]byte, 64), RunId: "r"}); err != nil {
		t.Fatalf("a push after the silent connections: %v", err)
	}
}

// PullView leaves a payload that came in shared memory there: its
// Params is the server's shared snapshot slot (snapshots.go), or the
// connection's region when the server has no slots (the server's next
// answer overwrites either), dst is untouched. Without a region (shared
// memory off) it is PullInto.
func TestPullViewLeavesThePayloadInTheRegion(t *testing.T) {
	const n = 1000
	for _, mode := range []string{"off", "region", "snapshots"} {
		e := &echoBackend{params: make([]byte, 4*n)}
		var setup func(*Server)
		if mode == "region" {
			setup = noSnapshots
		}
		_, addr := serveShm(t, e, Config{NoSharedMemory: mode == "off"}, setup)
		c := client(addr, 8<<20)
		ctx := context.Background()
		r := rand.New(rand.NewPCG(3, 4))
		var want [2][]byte
		for i := range want {
			segs := segments(r, n)
			if _, err := c.PushSegments(ctx, &pb.PushRequest{RunId: "r"}, segs); err != nil {
				t.Fatal(err)
			}
			want[i] = flat(segs)
		}
		dst := [][]float32{make([]float32, n/2), make([]float32, n-n/2)}
		resp, err := c.PullView(ctx, &pb.PullRequest{RunId: "r"}, dst)
		if err != nil {
			t.Fatal(err)
		}
		if mode == "off" {
			if resp.Params != nil || !bytes.Equal(flat(dst), want[1]) {
				t.Fatalf("without shared memory: %d bytes in Params, dst holds the push: %v", len(resp.Params), bytes.Equal(flat(dst), want[1]))
			}
			c.Close()
			continue
		}
		shm, _ := clientShm(c)
		if mode == "snapshots" {
			c.mu.Lock()
			shm = c.snaps.mem
			c.mu.Unlock()
		}
		switch {
		case !bytes.Equal(resp.Params, want[1]):
			t.Fatalf("%s: the view is not the last push", mode)
		case &resp.Params[0] != &shm[0]:
			t.Fatalf("%s: Params is not a view of the region", mode)
		case !bytes.Equal(flat(dst), make([]byte, 4*n)):
			t.Fatalf("%s: PullView wrote into dst", mode)
		}
		// The next request frees the slot or reuses the region: the
		// view shows the next answer.
		view := resp.Params
		segs := segments(r, n)
		if _, err := c.PushSegments(ctx, &pb.PushRequest{RunId: "r"}, segs); err != nil {
			t.Fatal(err)
		}
		if mode == "snapshots" {
			if _, err := c.PullView(ctx, &pb.PullRequest{RunId: "r"}, dst); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(view, flat(segs)) {
			t.Fatalf("%s: the region did not carry the next answer: the view was a copy", mode)
		}
		c.Close()
	}
}
