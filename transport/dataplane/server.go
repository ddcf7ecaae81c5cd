package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/internal/ratelog"
	"github.com/pstrain/pstrain/ml/vec"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/wire"
)

// Backend is what a parameter server answers on the data plane;
// *ps.Server implements it (the same handlers serve gRPC).
type Backend interface {
	// PullShared answers a pull whose parameters the server may read
	// until it calls release, exactly once, after writing them. While
	// any hold on a parameter buffer is outstanding the backend does not
	// write it, so another pull answered with the same buffer meanwhile
	// has the same bytes (the server shares one copy of them between
	// same-host connections: snapshots.go).
	PullShared(context.Context, *pb.PullRequest) (resp *pb.PullResponse, release func(), err error)
	Push(context.Context, *pb.PushRequest) (*pb.PushResponse, error)
}

// NowPuller is a Backend that can also answer a pull that need not wait
// without a context (*ps.Server does): ready is false, and nothing held,
// when the pull would wait.
type NowPuller interface {
	PullSharedNow(*pb.PullRequest) (resp *pb.PullResponse, release func(), ready bool, err error)
}

// PushKeeper is a Backend that may keep a push's payload buffer after
// answering it (*ps.Server does, for its standby's queue): it calls
// release exactly once when done with it. The server reuses the buffer
// for a later push only then.
type PushKeeper interface {
	PushKept(ctx context.Context, req *pb.PushRequest, release func()) (*pb.PushResponse, error)
}

// SquaresKeeper is a PushKeeper that can be told the sum of squares of
// a push's payload read as little-endian float32s, bit for bit
// vec.SumSquares of them, which the server computes as it copies a
// gradient out of a shared region (vec.CopySumSquares): a backend that
// reads the payload as float32s then need not pass over it again for
// its norm (*ps.Server does).
type SquaresKeeper interface {
	PushKeptSquares(ctx context.Context, req *pb.PushRequest, release func(), sumSquares float64) (*pb.PushResponse, error)
}

// Config configures a Server.
type Config struct {
	// MaxPayload is the largest payload a frame may announce
	// (--max-message-mb, or less); a larger one is refused before it is
	// read.
	MaxPayload int
	// Limits bound connections, buffered bytes and slow clients.
	Limits Limits
	Log    *slog.Logger
	// Metrics receives the refusal counts, the connection count and the
	// bytes buffered (nil: none).
	Metrics *metrics.PS
	// Now is the clock of the refusal log and of buffer reuse (nil:
	// time.Now). Connection deadlines use the real clock.
	Now func() time.Time
	// Auth, when set, is the run's keyring: every request must carry a
	// valid session credential whose sender may make it (auth.AllowPull,
	// auth.AllowPush), or it is refused before its payload is read and
	// its connection closed. nil: no credential is needed (tests).
	Auth *auth.Keyring
	// NoSharedMemory refuses the shared-memory regions same-host clients
	// offer (shm.go): their payloads go through the socket.
	NoSharedMemory bool
	// TLS, when set, makes the plane mutual TLS: NewServer wraps the
	// listener with it, and the same-host socket beside a loopback
	// listener takes only clients that prove they hold a certificate of
	// its ClientCAs (localauth.go), binding each connection to the
	// certificate's name as TLS does. A listener the caller wrapped in
	// TLS itself gets no same-host socket. On TCP each connection does
	// the TLS handshake, then carries its frames in records of its own
	// (integrity.go, records.go): sealed, or with a config from
	// WithPrivacy(cfg, true) in the clear with a tag (integrity-only).
	TLS *tls.Config
}

// Server serves a Backend on a listener (Config.TLS for TLS).
type Server struct {
	b     Backend
	lis   net.Listener
	local net.Listener // the same-host socket beside lis (local.go), or nil
	// localAuth authenticates the same-host socket's clients under TLS
	// (localauth.go); nil: plaintext.
	localAuth *LocalAuth
	// records is the TLS the server handshakes with before it switches
	// to records (integrity.go); nil: lis is plaintext (or TLS of the
	// caller's).
	records *tls.Config
	pid     int // this process, as the same-host exchange signs it
	cfg     Config
	lim     Limits
	m       *metrics.PS
	refusal *ratelog.Logger
	bufs    *buffers
	ctx     context.Context // cancelled by Close
	stop    context.CancelFunc
	uid     int // the user whose processes may hand us a region (shm.go)
	// snaps are the pull answers shared by the same-host connections
	// (snapshots.go), in the region whose descriptor is snapFD; nil:
	// none (no same-host socket, shared memory off, or no region).
	snaps   *snapshots
	snapFD  int
	regions atomic.Int64 // clients' regions mapped
	inShm   atomic.Int64 // payloads read from or written into a region (tests)
	// tests: read no preamble, as a server of an earlier build
	noPreamble bool

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a server for b on lis.
func NewServer(b Backend, lis net.Listener, cfg Config) *Server {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := cfg.Metrics
	if m == nil {
		m = metrics.NewPS(nil)
	}
	lim := cfg.Limits.WithDefaults()
	ctx, stop := context.WithCancel(context.Background())
	local := listenLocal(lis)
	var la *LocalAuth
	var records *tls.Config
	if cfg.TLS != nil {
		lis, records = handshakeListener{lis}, privacyOf(cfg.TLS)
		if la = localAuthOf(cfg.TLS, cfg.TLS.ClientCAs); la == nil && local != nil {
			local.Close() // no certificate to bind same-host clients to: TLS only
			local = nil
		}
	}
	s := &Server{b: b, lis: lis, local: local, localAuth: la, records: records, pid: os.Getpid(), cfg: cfg, lim: lim, m: m,
		refusal: ratelog.New(cfg.Log, lim.LogEvery, cfg.Now),
		bufs:    newBuffers(lim, cfg.Now, func(n int64) { m.DataPlaneBuffered.Set(float64(n)) }),
		ctx:     ctx, stop: stop, uid: serverUID(), conns: map[net.Conn]struct{}{}, snapFD: -1}
	if local != nil && !cfg.NoSharedMemory {
		var err error
		if s.snaps, s.snapFD, err = newServerSnapshots(cfg.MaxPayload); err != nil {
			cfg.Log.Warn("data plane: no shared pull answers; each same-host pull is written into its connection's region", "err", err)
		}
	}
	return s
}

// SnapshotBuffers lends a backend memory for its pull snapshots in the
// server's shared snapshot region, so that a pull answered with such a
// buffer reaches same-host clients with nothing copied (snapshots.go).
// *ps.Server takes it (ps.SnapshotBuffers).
type SnapshotBuffers interface {
	// Lend is a buffer of n bytes, the backend's until Return; false:
	// none (n too large, or no slot free to lend).
	Lend(n int) ([]byte, bool)
	// Return gives b back. The backend calls it only when it holds no
	// pull answered with b any more, and no longer reads or writes b.
	Return(b []byte)
}

// SnapshotBuffers is the server's snapshot region as a lender of pull
// snapshot buffers, or nil when it has none (no same-host socket, shared
// memory off). The memory stays mapped after Close until every buffer is
// given back.
func (s *Server) SnapshotBuffers() SnapshotBuffers {
	if s.snaps == nil {
		return nil
	}
	return s.snaps
}

// SetPushSize tells the server the size in bytes of the shard's
// gradient as pushed (its parameters times 4, or 2 with bf16): a push
// announcing more is refused before its payload is read, and the buffer
// budget holds at least MinBufferedPushes such pushes. Call it whenever
// the shard is initialised.
func (s *Server) SetPushSize(n int) { s.bufs.setSize(n) }

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Serve accepts connections until Close, on the listener and on the
// same-host socket beside it (local.go). It returns nil after Close. An
// accept error (e.g. out of file descriptors) is logged and retried with
// backoff, as net/http does, so the data plane never stops quietly. A
// connection past Limits.MaxConns (both listeners' together) is closed
// at once.
func (s *Server) Serve() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.wg.Add(1)
	if s.local != nil {
		s.wg.Add(1)
	}
	s.mu.Unlock()
	go s.housekeep()
	if s.local != nil {
		go func() {
			defer s.wg.Done()
			s.accept(s.local)
		}()
	}
	s.accept(s.lis)
	return nil
}

// accept serves lis's connections until Close (see Serve).
func (s *Server) accept(lis net.Listener) {
	backoff := 5 * time.Millisecond
	for {
		c, err := lis.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			s.cfg.Log.Warn("data plane: accept failed; retrying", "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-s.ctx.Done():
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if len(s.conns) >= s.lim.MaxConns {
			s.mu.Unlock()
			s.cut(c, "limit", fmt.Errorf("%d connections open (--max-connections)", s.lim.MaxConns))
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.m.DataPlaneConnections.Set(float64(len(s.conns)))
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			// The slot is free before the client sees the connection
			// closed.
			s.mu.Lock()
			delete(s.conns, c)
			s.m.DataPlaneConnections.Set(float64(len(s.conns)))
			s.mu.Unlock()
			c.Close()
		}()
	}
}

// housekeep flushes the refusal log and drops push buffers kept unused
// too long, every LogEvery, until Close.
func (s *Server) housekeep() {
	defer s.wg.Done()
	t := time.NewTicker(s.lim.LogEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.refusal.Flush(false)
			s.bufs.trim()
		case <-s.ctx.Done():
			s.refusal.Flush(true)
			return
		}
	}
}

// Close stops accepting, closes every connection and waits for their
// handlers.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.stop()
	err := s.lis.Close()
	if s.local != nil {
		s.local.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	if s.snaps != nil {
		closeSnapshots(s.snaps, s.snapFD)
		s.snaps = nil
	}
	s.mu.Unlock()
	return err
}

// cut counts and logs (rate-limited) a connection refused or closed for
// reason, a ConnectionsClosed reason. An idle connection closed is
// housekeeping, not a warning (a healthy client reconnects when it next
// calls): it is logged at debug level.
func (s *Server) cut(c net.Conn, reason string, err error) {
	s.m.ConnectionsClosed.WithLabelValues("data", reason).Inc()
	if reason == "idle" {
		s.cfg.Log.Debug("data plane: idle connection closed", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	s.refusal.Warn(reason, "data plane: connection closed", "reason", reason, "remote", c.RemoteAddr().String(), "err", err)
}

// reject counts and logs (rate-limited) a request refused for reason, a
// RejectedRequests reason, and answers it with code; the caller then
// closes the connection.
func (s *Server) reject(c net.Conn, hdr []byte, reason string, code codes.Code, err error) {
	s.m.RejectedRequests.WithLabelValues(reason).Inc()
	s.refusal.Warn(reason, "data plane: request refused; closing its connection", "reason", reason, "remote", c.RemoteAddr().String(), "err", err)
	s.writeError(c, hdr, code, err.Error())
	linger(c)
}

// lingerFor and lingerBytes bound how long and how much of a refused
// connection is drained: enough for a worker's push (a default shard's
// gradient is 1.3 MB), far less than what an attacker announces.
const (
	lingerFor   = time.Second
	lingerBytes = 16 << 20
)

// linger half-closes c and discards what the client still sends (a
// refused push's payload) for up to lingerFor before the caller closes
// it: closing with unread bytes makes the kernel reset the connection,
// and a reset can overtake the refusal just written, leaving the client
// with "connection reset" (which it retries) instead of the reason
// (which it reports). Draining costs no memory and stops after
// lingerBytes or lingerFor, whatever the client does.
func linger(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	var src io.Reader = c
	if r, ok := c.(interface{ rawReader() io.Reader }); ok {
		src = r.rawReader() // what is drained need not verify
	}
	c.SetReadDeadline(time.Now().Add(lingerFor))
	io.CopyN(io.Discard, src, lingerBytes)
}

// serveConn answers one connection's requests in order, until the
// connection is done; the caller closes it. A push's gradient is read
// into a buffer from the server's budget, and a pull writes the shard's
// immutable parameter snapshot straight to the socket, or both go
// through the region a same-host client offered (shm.go).
func (s *Server) serveConn(c net.Conn) {
	c, peer, ok := s.handshake(c)
	if !ok {
		return
	}
	var src io.Reader = c
	cs := &connShm{held: -1} // the client's region, or none
	if uc, ok := c.(*net.UnixConn); ok && !s.noPreamble {
		if cs.mem, cs.snaps, src, ok = s.takeRegion(uc); !ok {
			return
		}
		defer s.releaseRegion(cs.mem)
	}
	defer s.unhold(cs)
	rd := bufio.NewReaderSize(src, 64<<10)
	scratch := make([]byte, 512)
	hdr := make([]byte, 0, respLen)
	var rows rowConn
	for {
		req, ok := s.readHeader(c, rd, scratch, hdr, cs.held >= 0)
		if !ok {
			return
		}
		s.unhold(cs) // the client reads the last answer no more
		shm := cs.mem
		if !s.admit(c, hdr, peer, req, shm) {
			return
		}
		switch req.op {
		case opReplicate:
			if !s.replicate(c, rd, req, hdr, shm) {
				return
			}
			continue
		case opPullRows, opPushRows:
			if !s.serveRows(c, rd, req, hdr, shm, &rows) {
				return
			}
			continue
		}
		if !s.serveModel(c, rd, req, hdr, cs, &rows) {
			return
		}
	}
}

// serveModel reads a pull's or push's payload and answers it (a push
// after refused row pushes is refused: refuseAfterRows). false: the
// connection is done.
func (s *Server) serveModel(c net.Conn, rd *bufio.Reader, req request, hdr []byte, cs *connShm, rows *rowConn) bool {
	payload, sq, ok := s.readPayload(c, rd, req, hdr, cs.mem)
	if !ok {
		return false
	}
	if refused, ok := s.refuseAfterRows(c, hdr, req, payload, rows); refused {
		return ok
	}
	return s.answer(c, rd, req, payload, sq, hdr, cs)
}

// refuseAfterRows refuses, unapplied, a push sent after row pushes of
// its step (flagAfterRows) one of which was refused, releasing its
// payload; a push ends the step's row pushes on the connection (rc).
// ok false: the refusal could not be written, the connection is done.
func (s *Server) refuseAfterRows(c net.Conn, hdr []byte, req request, payload []byte, rc *rowConn) (refused, ok bool) {
	if req.op != opPush {
		return false, true
	}
	failed := rc.pushFailed
	rc.pushFailed = nil
	if !req.afterRows || failed == nil {
		return false, true
	}
	s.bufs.put(payload)
	resp, body := errorAnswer(status.Errorf(codes.Aborted, "not applied: a row push of the step before it failed: %s", status.Convert(failed).Message()))
	return true, s.respond(c, hdr, resp, body)
}

// admit checks a request before its payload is read: who sent it, and
// that a payload it says is in the shared region fits in the
// connection's region shm. A request it refuses is answered and false
// returned: the connection is done.
func (s *Server) admit(c net.Conn, hdr []byte, peer string, req request, shm []byte) bool {
	if err := s.authorize(peer, req); err != nil {
		code := codes.PermissionDenied
		if r := auth.Reason(err); r == auth.ReasonNoCredential || r == auth.ReasonBadCredential {
			code = codes.Unauthenticated
		}
		s.reject(c, hdr, auth.Reason(err), code, err)
		return false
	}
	if err := checkRegion(req, shm); err != nil {
		s.reject(c, hdr, "bad_frame", codes.InvalidArgument, err)
		return false
	}
	return true
}

// checkRegion is ErrBadFrame when req's payload is said to be in a
// shared region the connection does not have, or one that does not hold
// it.
func checkRegion(req request, shm []byte) error {
	switch {
	case !req.shm:
		return nil
	case shm == nil:
		return fmt.Errorf("%w: a shared-memory payload on a connection without a shared region", ErrBadFrame)
	case int64(req.payloadLen) > int64(len(shm)):
		return fmt.Errorf("%w: a payload of %d bytes in a shared region of %d", ErrBadFrame, req.payloadLen, len(shm))
	}
	return nil
}

// handshake authenticates a connection before its first byte of data:
// a TLS handshake, or on the same-host socket under TLS the certificate
// exchange (localauth.go). peer is the name of the client's certificate
// ("" on plaintext). The connection to serve is returned: c, or on TCP
// under TLS the records over it (integrity.go). false:
// the connection is done.
func (s *Server) handshake(c net.Conn) (net.Conn, string, bool) {
	// Like gRPC's: a client that never finishes the handshake does not
	// hold the connection forever.
	switch tc := c.(type) {
	case *tls.Conn:
		tc.SetDeadline(time.Now().Add(handshakeTimeout))
		if err := tc.Handshake(); err != nil {
			s.cut(c, "tls", explainHandshake(err))
			return c, "", false
		}
		tc.SetDeadline(time.Time{})
		return c, peerCertName(c), true
	case *recordConn:
		if s.records != nil {
			mc, peer, err := serverRecords(tc, s.records)
			if err != nil {
				s.cut(c, "tls", err)
				return c, "", false
			}
			return mc, peer, true
		}
	case *net.UnixConn:
		if s.localAuth != nil {
			peer, ok := s.localHandshake(tc)
			return c, peer, ok
		}
	}
	return c, "", true
}

// localHandshake runs the same-host certificate exchange (localauth.go)
// with a client of the same-host socket under TLS. A client that does
// not start it (a plaintext task, a client without certificates) is
// refused with Unauthenticated and counted as a certificate refusal;
// one whose certificate, signature or process does not verify is cut as
// a failed TLS handshake is.
func (s *Server) localHandshake(c *net.UnixConn) (peer string, ok bool) {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.SetDeadline(time.Time{})
	var m [4]byte
	if _, err := io.ReadFull(c, m[:]); err != nil {
		s.cut(c, "tls", fmt.Errorf("same-host handshake: %w", err))
		return "", false
	}
	if m != localMagic {
		s.reject(c, make([]byte, 0, respLen), auth.ReasonCertificate, codes.Unauthenticated,
			errors.New("this data plane is mutual TLS: a same-host client must prove it holds a certificate of the cluster's CA (start the task with --tls-dir)"))
		return "", false
	}
	p, _ := peerOf(c)
	name, err := s.localAuth.serverExchange(c, s.pid, p, s.uid, time.Now())
	if err != nil {
		s.cut(c, "tls", fmt.Errorf("same-host handshake: %w", err))
		return "", false
	}
	return name, true
}

// authorize checks req's credential (when the server requires one) and
// that its sender may make it; peer is the name of the connection's
// client certificate ("" on plaintext).
func (s *Server) authorize(peer string, req request) error {
	if s.cfg.Auth == nil {
		return nil
	}
	if req.id.Role == "" {
		return &auth.Error{Reason: auth.ReasonNoCredential, Msg: "the data plane needs a session credential: register with the chief first (is this client a task of the run?)"}
	}
	if err := s.cfg.Auth.VerifyFrame(req.id, req.signed, req.mac); err != nil {
		return err
	}
	if err := auth.CheckCertificate(peer, req.id); err != nil {
		return err
	}
	switch req.op {
	case opPush, opPushRows:
		return auth.AllowPush(req.id, req.worker)
	case opReplicate:
		return auth.AllowReplicate(req.id, req.worker) // the frame's shard
	}
	return auth.AllowPull(req.id, req.worker, req.retain)
}

// peerCertName is the common name of a TLS client's certificate ("" on
// plain TCP).
func peerCertName(c net.Conn) string {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return ""
	}
	if pc := tc.ConnectionState().PeerCertificates; len(pc) > 0 {
		return pc[0].Subject.CommonName
	}
	return ""
}

// readHeader waits up to IdleTimeout for a request to start, then up to
// FrameGrace for the rest of its header. false: the connection is done
// (closed, idle, slow or sent a bad frame: counted, logged, answered).
//
// A connection holding a snapshot slot (its last answer is there) is not
// cut for idleness: its client may still read that answer in place (a
// worker paused between pulls), and the cut would free the slot for
// other parameters under it. Such a client is a process of the server's
// own user on this host; while it holds the slot the others serve, and
// a pull finding every slot held is answered in its connection's region.
func (s *Server) readHeader(c net.Conn, rd *bufio.Reader, scratch, hdr []byte, holding bool) (request, bool) {
	idle := time.Now().Add(s.lim.IdleTimeout)
	if holding {
		idle = time.Time{}
	}
	c.SetReadDeadline(idle)
	if _, err := rd.Peek(1); err != nil {
		if isTimeout(err) {
			s.cut(c, "idle", fmt.Errorf("no request for %v", s.lim.IdleTimeout))
		}
		return request{}, false
	}
	c.SetReadDeadline(time.Now().Add(s.lim.FrameGrace))
	// The payload's size is checked below against the server's limits,
	// not by the frame reader, so that it is counted as too large.
	req, err := readRequest(rd, scratch, math.MaxInt)
	switch {
	case err == nil:
		return req, true
	case errors.Is(err, ErrBadFrame):
		s.reject(c, hdr, "bad_frame", codes.InvalidArgument, err)
	case isTimeout(err):
		s.cut(c, "slow", fmt.Errorf("request header not in within %v", s.lim.FrameGrace))
	}
	return request{}, false
}

// readPayload reads a push's gradient into a buffer of the budget,
// within FrameGrace + length/MinRate. A push larger than MaxPayload, the
// shard's push size or the whole budget is refused before its payload is
// read, as is one the budget has no room for within BufferWait. false:
// the connection is done.
//
// A gradient in the shared region shm (the caller checked it is within)
// is copied out before the backend sees it: the client can write the
// region at any time, and the backend may keep the buffer (PushKeeper)
// after the push is answered. The copy also sums the gradient's
// squares (copyOut).
func (s *Server) readPayload(c net.Conn, rd *bufio.Reader, req request, hdr, shm []byte) ([]byte, squares, bool) {
	defer c.SetReadDeadline(time.Time{})
	n := int(req.payloadLen)
	if n > s.cfg.MaxPayload {
		s.reject(c, hdr, "too_large", codes.InvalidArgument,
			fmt.Errorf("%w: payload of %d bytes exceeds the limit of %d (--max-message-mb)", errTooLarge, n, s.cfg.MaxPayload))
		return nil, squares{}, false
	}
	payload, err := s.bufs.get(s.ctx, n, s.lim.BufferWait)
	if err != nil {
		s.payloadFailed(c, hdr, n, err)
		return nil, squares{}, false
	}
	if req.shm {
		if n > 0 {
			s.inShm.Add(1)
		}
		return payload, copyOut(payload, shm[:n]), true
	}
	if !s.readSocket(c, rd, hdr, payload) {
		s.bufs.put(payload)
		return nil, squares{}, false
	}
	return payload, squares{}, true
}

// readSocket reads a request's payload from the connection into buf
// (its length), within FrameGrace + length/MinRate. false: it failed
// (payloadFailed), and the connection is done.
func (s *Server) readSocket(c net.Conn, rd *bufio.Reader, hdr, buf []byte) bool {
	c.SetReadDeadline(time.Now().Add(s.lim.frameTime(len(buf))))
	_, err := io.ReadFull(rd, buf)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		s.payloadFailed(c, hdr, len(buf), err)
		return false
	}
	return true
}

// errorAnswer is the response and payload that carry err's status.
func errorAnswer(err error) (response, []byte) {
	st := status.Convert(err)
	return response{code: byte(st.Code())}, []byte(st.Message())
}

// squares is a push payload's sum of squares as float32s (see
// SquaresKeeper), when known.
type squares struct {
	sum   float64
	known bool
}

// copyOut copies a payload out of a shared region into dst, summing its
// squares as float32s on the way (read back from dst, which only the
// server writes: the sum is of the values the backend gets) when both
// can be viewed as float32s; else it only copies.
func copyOut(dst, src []byte) squares {
	d, okd := wire.View(dst)
	f, oks := wire.View(src)
	if !okd || !oks || len(src) == 0 {
		copy(dst, src)
		return squares{}
	}
	return squares{sum: vec.CopySumSquares(d, f), known: true}
}

// payloadFailed handles an error reading a payload of n bytes: a
// malformed one or one the budget can never or not now hold is refused,
// one too slow is cut; else the connection broke or the server is
// closing. The caller then closes the connection.
func (s *Server) payloadFailed(c net.Conn, hdr []byte, n int, err error) {
	switch {
	case errors.Is(err, ErrBadFrame):
		s.reject(c, hdr, "bad_frame", codes.InvalidArgument, err)
	case errors.Is(err, errTooLarge):
		s.reject(c, hdr, "too_large", codes.InvalidArgument, err)
	case errors.Is(err, errBusy):
		used, kept, limit := s.bufs.stats()
		s.reject(c, hdr, "busy", codes.Unavailable, fmt.Errorf("%w (%d of %d bytes in use, %d kept)", err, used, limit, kept))
	case isTimeout(err):
		s.cut(c, "slow", fmt.Errorf("a payload of %d bytes not in within %v", n, s.lim.frameTime(n)))
	}
}

// answer handles one request and writes its response within
// FrameGrace + length/MinRate; payload, a buffer of the budget (or nil),
// is released, or handed to a PushKeeper backend that releases it. false:
// the connection is done. A pull that asks for it is answered in shared
// memory (placeShared) when its parameters fit.
func (s *Server) answer(c net.Conn, rd *bufio.Reader, req request, payload []byte, sq squares, hdr []byte, cs *connShm) bool {
	var resp response
	var body []byte
	release := func() {}
	switch req.op {
	case opPull:
		pr, done, err := s.pull(c, rd, req)
		if err != nil {
			if errors.Is(err, errGone) {
				return false
			}
			resp, body = errorAnswer(err)
			break
		}
		resp.version, resp.generation, resp.done, body = pr.Version, pr.Generation, pr.Done, pr.Params
		resp.dataPosition = pr.DataPosition
		release = done
		if req.shm {
			body, release = s.placeShared(req, &resp, body, release, cs)
		}
	case opPush:
		pr, err := s.push(&pb.PushRequest{Worker: req.worker, Version: req.version,
			Grad: payload, RunId: req.runID, Loss: req.loss, Generation: req.generation, DataPosition: req.dataPos}, sq)
		if err != nil {
			resp, body = errorAnswer(err)
			break
		}
		resp.outcome, resp.version, resp.done = byte(pr.Outcome), pr.Version, pr.Done
	}
	ok := s.respond(c, hdr, resp, body)
	release()
	return ok
}

// placeShared answers a pull of body (held by release) in shared memory:
// in a slot of the server's snapshot region that holds it or takes it
// (snapshots.go), which the connection then holds until its next request,
// else copied into the connection's region if it fits there. It returns
// the body left to send on the socket (nil when placed) and what to
// release once the response is written.
func (s *Server) placeShared(req request, resp *response, body []byte, release func(), cs *connShm) ([]byte, func()) {
	if cs.snaps && !req.delta && s.snaps != nil {
		if slot, ok := s.snaps.share(body, release); ok {
			s.inShm.Add(1)
			cs.held = slot
			resp.shm, resp.snap, resp.outcome, resp.payloadLen = true, true, byte(slot), uint32(len(body))
			return nil, func() {}
		}
	}
	if len(body) <= len(cs.mem) {
		s.inShm.Add(1)
		copy(cs.mem, body)
		resp.shm, resp.payloadLen = true, uint32(len(body))
		return nil, release
	}
	return body, release
}

// unhold ends cs's hold on the snapshot slot of its last answer, if any.
func (s *Server) unhold(cs *connShm) {
	if cs.held >= 0 {
		s.snaps.drop(cs.held)
		cs.held = -1
	}
}

// respond writes resp (into hdr's room) with body as its payload within
// FrameGrace + length/MinRate. false: the connection is done.
func (s *Server) respond(c net.Conn, hdr []byte, resp response, body []byte) bool {
	if !resp.shm {
		resp.payloadLen = uint32(len(body))
	}
	bufs := net.Buffers{appendResponse(hdr[:0], resp), body}
	c.SetWriteDeadline(time.Now().Add(s.lim.frameTime(len(body))))
	_, err := writeGathered(c, bufs)
	c.SetWriteDeadline(time.Time{})
	if isTimeout(err) {
		s.cut(c, "slow", fmt.Errorf("a response of %d bytes not taken within %v", len(body), s.lim.frameTime(len(body))))
	}
	return err == nil
}

// push hands pr to the backend with its payload buffer: lent to a
// PushKeeper (with its sum of squares to a SquaresKeeper, when known),
// released here after any other backend's Push.
func (s *Server) push(pr *pb.PushRequest, sq squares) (*pb.PushResponse, error) {
	buf := pr.Grad
	var once sync.Once
	release := func() { once.Do(func() { s.bufs.put(buf) }) }
	if k, ok := s.b.(SquaresKeeper); ok && sq.known {
		return k.PushKeptSquares(context.Background(), pr, release, sq.sum)
	}
	if k, ok := s.b.(PushKeeper); ok {
		return k.PushKept(context.Background(), pr, release)
	}
	defer s.bufs.put(buf)
	return s.b.Push(context.Background(), pr)
}

// isTimeout reports a deadline that passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// errGone means the client went away while its pull was blocked.
var errGone = errors.New("dataplane: client gone")

// pull runs a (possibly long-blocking) pull, cancelling it if the client
// closes the connection meanwhile. Clients never send while a request is
// outstanding, so any read that returns during the pull means the client
// is gone (or broke the protocol). On success the caller calls release
// once the parameters are written.
func (s *Server) pull(c net.Conn, rd *bufio.Reader, req request) (resp *pb.PullResponse, release func(), err error) {
	pr := &pb.PullRequest{Worker: req.worker, MinVersion: req.version, RunId: req.runID,
		Generation: req.generation, Retain: req.retain, Delta: req.delta}
	if req.delta {
		pr.DeltaBase = req.dataPos
	}
	if now, ok := s.b.(NowPuller); ok {
		// A pull that need not wait needs no watcher: the goroutine and
		// the two deadline changes cost more than the answer.
		if resp, release, ready, err := now.PullSharedNow(pr); err != nil || ready {
			return resp, release, err
		}
	}
	if s.watched(c, rd, func(ctx context.Context) { resp, release, err = s.b.PullShared(ctx, pr) }) {
		if err == nil {
			release()
		}
		return nil, nil, errGone
	}
	return resp, release, err
}

// watched runs fn with a context that is cancelled if the client closes
// the connection meanwhile, and reports whether it did (gone). Clients
// never send while a request is outstanding, so any read that returns
// during fn means the client is gone (or broke the protocol).
func (s *Server) watched(c net.Conn, rd *bufio.Reader, fn func(context.Context)) (gone bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watcher := make(chan bool, 1) // true: the client is gone
	go func() {
		_, err := rd.Peek(1)
		gone := !isTimeout(err)
		if gone {
			cancel()
		}
		watcher <- gone
	}()
	fn(ctx)
	// Stop the watcher: a read deadline in the past wakes it.
	c.SetReadDeadline(time.Unix(1, 0))
	gone = <-watcher
	c.SetReadDeadline(time.Time{})
	return gone
}

func (s *Server) writeError(c net.Conn, hdr []byte, code codes.Code, msg string) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	bufs := net.Buffers{appendResponse(hdr[:0], response{code: byte(code), payloadLen: uint32(len(msg))}), []byte(msg)}
	bufs.WriteTo(c)
}
