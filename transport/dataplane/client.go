package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/wire"
)

// Resolve returns the data-plane address of a parameter server (the
// worker asks the PS over gRPC, so the address is the PS's own
// --data-addr, whatever it is configured to).
type Resolve func(ctx context.Context) (string, error)

// Client is one worker's connection to one parameter server's data plane.
// Its Pull and Push have the signatures of the gRPC client's, so the
// worker uses either. The parameters a Pull returns live in a buffer the
// next call reuses: use them before calling again. A Client serialises its
// calls.
type Client struct {
	resolve    Resolve
	tls        *tls.Config // nil: plain TCP
	maxPayload int
	auth       *auth.Client // nil: requests go unsigned
	// localAuth, under TLS, is the certificate a same-host connection
	// authenticates with instead of a TLS handshake (localauth.go); nil:
	// under TLS, TCP only.
	localAuth *LocalAuth

	mu      sync.Mutex
	addr    string
	conn    net.Conn
	rd      *bufio.Reader
	hdr     []byte
	scratch []byte
	buf     []byte

	// Shared memory with a same-host server (shm.go).
	local   bool        // conn is a same-host (Unix) connection
	noLocal bool        // under TLS, the same-host exchange failed with this server: TCP until it is resolved again
	shm     []byte      // conn's region, once the server took it; nil: none
	snaps   sharedSnaps // the server's shared pull answers, read-only (snapshots.go); zero: none
	noShm   bool        // the server refused a region or cannot take one: do not offer again
	shmFit  int         // the largest payload seen: the next region holds it
	shmRd   bytes.Reader

	// Row requests' buffers (rows.go): the payload written out and the
	// answer decoded, kept while within keepRowBytes.
	rowBufs rowBufs
}

// NewClient returns a client that finds its server with resolve. With a
// TLS config the connection is TLS (the server name is the resolved
// host), except to a same-host server, which the client reaches over the
// Unix socket and authenticates with the config's certificate and
// RootCAs instead (localauth.go), when the config has them. A config
// from WithPrivacy(cfg, true) runs the integrity-only mode over TCP, any
// other the encrypt mode (integrity.go).
func NewClient(resolve Resolve, tlsConfig *tls.Config, maxPayload int) *Client {
	var la *LocalAuth
	if tlsConfig != nil {
		la = localAuthOf(tlsConfig, tlsConfig.RootCAs)
	}
	return &Client{resolve: resolve, tls: tlsConfig, localAuth: la, maxPayload: maxPayload, scratch: make([]byte, respLen)}
}

// SignWith signs every request with c's session (call before the first
// request).
func (c *Client) SignWith(a *auth.Client) { c.auth = a }

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop()
	return nil
}

func (c *Client) drop() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	unmap(c.shm)
	unmap(c.snaps.mem)
	c.shm, c.snaps, c.local = nil, sharedSnaps{}, false
	c.shmRd.Reset(nil)
}

// connect connects if need be; a same-host connection made for a push
// or pull of up to fit bytes (0: other calls) is offered a region that
// holds them (shm.go).
func (c *Client) connect(ctx context.Context, fit int) error {
	if c.conn != nil {
		return nil
	}
	if err := c.resolveAddr(ctx); err != nil {
		return err
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := c.dial(ctx, &d, fit)
	if err != nil {
		return status.Errorf(codes.Unavailable, "data plane %s: %v", c.forgetAddr(), err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	_, local := conn.(*net.UnixConn)
	if c.tls != nil && !local {
		if conn, err = c.handshakeTLS(ctx, conn); err != nil {
			return status.Errorf(codes.Unavailable, "data plane %s: TLS handshake: %v", c.forgetAddr(), err)
		}
	}
	c.conn, c.rd, c.local = conn, bufio.NewReaderSize(conn, 64<<10), local
	return nil
}

// resolveAddr asks for the server's address unless the client has one.
func (c *Client) resolveAddr(ctx context.Context) error {
	if c.addr != "" {
		return nil
	}
	c.noShm, c.noLocal = false, false // perhaps another server
	addr, err := c.resolve(ctx)
	if err != nil {
		return err
	}
	if addr == "" {
		return status.Error(codes.FailedPrecondition, "the parameter server has no TCP data plane (start it with --data-plane tcp)")
	}
	c.addr = addr
	return nil
}

// forgetAddr returns the server's address and forgets it: a restarted PS
// listens elsewhere, so the next call asks again.
func (c *Client) forgetAddr() string {
	addr := c.addr
	c.addr = ""
	return addr
}

// dial opens a connection to c.addr: the same-host socket if the server
// has one (local.go), offered a region for payloads of up to fit bytes
// (shm.go), else TCP.
func (c *Client) dial(ctx context.Context, d *net.Dialer, fit int) (net.Conn, error) {
	conn := c.dialSameHost(ctx, d) // same host: no TCP (local.go)
	if uc, ok := conn.(*net.UnixConn); ok && fit > 0 && !c.noShm {
		var err error
		if conn, err = c.offer(ctx, d, uc, fit); err != nil {
			return nil, err
		}
	}
	if conn != nil {
		return conn, nil
	}
	return d.DialContext(ctx, "tcp", c.addr)
}

// handshakeTLS runs the client's TLS handshake on conn, named by the
// resolved host unless the config names the server; on failure conn is
// closed.
func (c *Client) handshakeTLS(ctx context.Context, conn net.Conn) (net.Conn, error) {
	cfg := privacyOf(c.tls)
	if host, _, err := net.SplitHostPort(c.addr); err == nil && cfg.ServerName == "" {
		cfg.ServerName = host
	}
	rc := newRecordConn(conn)
	tc := tls.Client(rc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, explainHandshake(err)
	}
	mc, err := clientRecords(ctx, tc, rc, cfg) // frames in records of our own (integrity.go)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return mc, nil
}

// dialSameHost dials the server's same-host socket, if it has one, and
// under TLS authenticates both ends with their certificates
// (localauth.go); nil when there is none or that fails (then the client
// dials TCP).
func (c *Client) dialSameHost(ctx context.Context, d *net.Dialer) net.Conn {
	if c.tls != nil && (c.localAuth == nil || c.noLocal) {
		return nil
	}
	conn := dialLocal(ctx, d, c.addr)
	if conn == nil || c.tls == nil {
		return conn
	}
	p, ok := peerOf(conn)
	if !ok {
		conn.Close()
		return nil
	}
	deadline := time.Now().Add(handshakeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	_, err := c.localAuth.clientExchange(conn, os.Getpid(), p, os.Geteuid(), time.Now())
	stop()
	conn.SetDeadline(time.Time{})
	if err != nil {
		// A plaintext server, one that refused us, or not a task of
		// the cluster: TLS over TCP with this server from now on (a
		// cancelled call says nothing about the server).
		conn.Close()
		c.noLocal = ctx.Err() == nil
		return nil
	}
	return conn
}

// offer offers uc's server a region for payloads of up to fit bytes and
// returns the connection to use: uc, with c.shm set if the server took
// the region; or a new one if the server could not read the offer (a
// server of an earlier build, which closes the connection), nil if that
// fails (then the client dials TCP); or an error if the connection broke.
// Once a server has refused, the client offers no more.
func (c *Client) offer(ctx context.Context, d *net.Dialer, uc *net.UnixConn, fit int) (net.Conn, error) {
	deadline := time.Now().Add(d.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	// A cancelled call does not wait for the server's answer.
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Unix(1, 0)) })
	mem, snaps, st, err := offerRegion(uc, regionSize(fit, c.maxPayload), deadline)
	stop()
	switch {
	case err == nil && mem != nil:
		c.shm, c.snaps = mem, snaps
		return uc, nil
	case err == nil && st == regionNotOffered:
		return uc, nil // no region to offer this time (memfd or mmap failed here): perhaps next time
	case err == nil:
		c.noShm = true
		return uc, nil
	}
	uc.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if errors.Is(err, errNoPreamble) {
		c.noShm = true
		return c.dialSameHost(ctx, d), nil
	}
	return nil, err
}

// call sends one request and reads its response. The payload is sent
// from its slices as they are (writev), or copied into the connection's
// shared region if it has one that holds it (shm.go). The response's
// payload goes into dst if it is given and the sizes agree, else into the
// client's buffer.
//
// A server closes a connection that stays idle (dataplane.Limits
// IdleTimeout); if a reused connection turns out closed before any of
// the response arrives, the request was never read: call sends it once
// more on a new connection.
func (c *Client) call(ctx context.Context, req request, payload net.Buffers, dst [][]float32, view bool) (response, []byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.callLocked(ctx, req, payload, dst, view)
}

// callLocked is call with the client's lock held.
func (c *Client) callLocked(ctx context.Context, req request, payload net.Buffers, dst [][]float32, view bool) (response, []byte, error) {
	return c.callAfter(ctx, nil, req, payload, dst, view)
}

// ahead is a request a call writes before its own on the same
// connection, without waiting for its answer (PushAfterRows): its
// payload goes on the socket, and its answer, read before the call's,
// carries no payload but an error's message.
type ahead struct {
	req     request
	payload []byte
	resp    response // its answer, once read
	msg     string   // an error answer's message
	read    bool     // the answer was read
}

// err is ahead's answer as an error (nil: it succeeded).
func (a *ahead) err() error {
	if a.resp.code == 0 {
		return nil
	}
	return status.Error(codes.Code(a.resp.code), a.msg)
}

// callAfter is callLocked with the requests pre written first, ahead
// of req, their answers read into them. An error answer to one of them
// is the call's error, also when the server then closed the connection
// (as it does after refusing a frame); the call's own request was sent
// all the same.
func (c *Client) callAfter(ctx context.Context, pre []ahead, req request, payload net.Buffers, dst [][]float32, view bool) (response, []byte, error) {
	if longRunID(pre, req) {
		return response{}, nil, status.Error(codes.InvalidArgument, "run id longer than 255 bytes")
	}
	if err := ctx.Err(); err != nil {
		return response{}, nil, status.FromContextError(err).Err()
	}
	req.payloadLen = uint32(buffersLen(payload))
	fit := c.regionFor(req, dst)
	for attempt := 0; ; attempt++ {
		reused := c.conn != nil
		if err := c.connect(ctx, fit); err != nil {
			return response{}, nil, err
		}
		resp, direct, err := c.exchange(ctx, pre, req, payload, dst, view)
		if err == nil {
			if err := aheadErr(pre); err != nil {
				return response{}, nil, err
			}
			return c.result(ctx, resp, direct, view)
		}
		c.drop()
		if reused && attempt == 0 && errors.Is(err, errClosedByServer) && ctx.Err() == nil {
			continue
		}
		if err := aheadErr(pre); err != nil {
			return response{}, nil, err
		}
		return response{}, nil, c.failed(ctx, err)
	}
}

// longRunID says whether a request of a call has a run id longer than
// the frame's one byte for its length can say.
func longRunID(pre []ahead, req request) bool {
	long := len(req.runID) > 255
	for _, p := range pre {
		long = long || len(p.req.runID) > 255
	}
	return long
}

// aheadErr is the first error answer read for the requests pre (nil:
// none).
func aheadErr(pre []ahead) error {
	for i := range pre {
		if err := pre[i].err(); err != nil && pre[i].read {
			return err
		}
	}
	return nil
}

// buffersLen is the number of bytes in b.
func buffersLen(b net.Buffers) int {
	n := 0
	for _, p := range b {
		n += len(p)
	}
	return n
}

// segmentsLen is the number of bytes in the float32 segments dst.
func segmentsLen(dst [][]float32) int {
	n := 0
	for _, d := range dst {
		n += 4 * len(d)
	}
	return n
}

// regionFor returns the size of the shared region req's payload needs
// (shm.go): a push's, pull's or replication batch's payload, at least
// the largest seen, within maxPayload. A same-host connection whose
// region is smaller is dropped, to connect again with one that holds it.
func (c *Client) regionFor(req request, dst [][]float32) int {
	// A pull's payload fills every slice of dst.
	fit := min(max(int(req.payloadLen), c.shmFit, segmentsLen(dst), 1), c.maxPayload)
	if c.conn != nil && c.local && !c.noShm && len(c.shm) < fit {
		c.drop()
	}
	return fit
}

// result is call's answer to a response exchange read: an error
// response as its status, else the response and its payload (nil when
// it went into dst; with view, the shared region's when it is there).
func (c *Client) result(ctx context.Context, resp response, direct, view bool) (response, []byte, error) {
	switch {
	case resp.code != 0:
		return response{}, nil, status.Error(codes.Code(resp.code), string(c.buf))
	case direct:
		return resp, nil, nil
	case !view || !resp.shm:
		return resp, c.buf, nil
	case resp.snap:
		if b, ok := c.snaps.at(int(resp.outcome), int(resp.payloadLen)); ok {
			return resp, b, nil
		}
		// Cancelled as the answer came: the connection, and the
		// mapping with it, is gone.
		err := ctx.Err()
		if err == nil {
			err = context.Canceled
		}
		return response{}, nil, status.FromContextError(err).Err()
	case c.shm == nil:
		// Cancelled as the answer came: the connection, and the
		// region with it, is gone.
		err := ctx.Err()
		if err == nil {
			err = context.Canceled
		}
		return response{}, nil, status.FromContextError(err).Err()
	}
	return resp, c.shm[:resp.payloadLen], nil
}

// failed turns the error of an exchange that will not be retried into
// call's status, and forgets the server's address: the PS may have
// restarted elsewhere.
func (c *Client) failed(ctx context.Context, err error) error {
	addr := c.forgetAddr()
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	var ne net.Error
	if _, ok := ctx.Deadline(); ok && errors.As(err, &ne) && ne.Timeout() {
		// The connection's deadline is the context's; it can fire a
		// moment before the context says so.
		return status.FromContextError(context.DeadlineExceeded).Err()
	}
	if errors.Is(err, ErrBadFrame) {
		return status.Errorf(codes.Internal, "data plane %s: %v", addr, err)
	}
	return status.Errorf(codes.Unavailable, "data plane %s: %v", addr, err)
}

// errClosedByServer wraps an error that shows the server closed the
// connection before answering: the write failed (broken pipe, reset) or
// the connection ended before the response's first byte.
var errClosedByServer = errors.New("closed by the server before answering")

// exchange writes one request on the connection and reads its response
// (an error response's message into c.buf). direct: the payload went
// into dst. With view, a payload in the shared region stays there (the
// caller reads it from c.shm). Call with mu and a connection.
func (c *Client) exchange(ctx context.Context, pre []ahead, req request, payload net.Buffers, dst [][]float32, view bool) (resp response, direct bool, err error) {
	conn := c.conn
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	} else {
		conn.SetDeadline(time.Time{})
	}
	// Cancelling ctx wakes a blocked read or write. If it fired after the
	// call finished, the connection's deadline is in the past: drop it.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() && c.conn == conn {
			c.drop()
		}
	}()
	for i := range pre {
		pre[i].req.shm, pre[i].read = false, false
	}
	for i := range pre {
		if err := c.writeRequest(conn, pre[i].req, net.Buffers{pre[i].payload}); err != nil {
			return resp, false, c.writeFailed(pre[:i], err)
		}
	}
	req.shm = c.regionHolds(req)
	if err := c.writeRequest(conn, req, payload); err != nil {
		return resp, false, c.writeFailed(pre, err)
	}
	if _, err := c.rd.Peek(1); err != nil {
		return resp, false, closedByServer(err)
	}
	for i := range pre {
		if err := c.readAhead(&pre[i]); err != nil {
			return resp, false, err
		}
	}
	if resp, err = readResponse(c.rd, c.scratch, c.maxPayload); err != nil {
		return resp, false, err
	}
	body, err := c.responseBody(req, resp, view)
	if body == nil || err != nil {
		return resp, false, err
	}
	direct, err = c.readBody(body, resp, dst)
	return resp, direct, err
}

// writeFailed is exchange's error for a write that failed after the
// requests written reached the server: the answers that came to those
// are read (the server may have taken some, then cut the connection:
// they must not be sent again), and only if none came is it
// errClosedByServer, which callAfter sends again.
func (c *Client) writeFailed(written []ahead, err error) error {
	for i := range written {
		if c.readAhead(&written[i]) != nil {
			break
		}
	}
	if len(written) > 0 && written[0].read {
		return err
	}
	return closedByServer(err)
}

// readAhead reads the answer to a request written ahead of a call's:
// one in the shared region is ErrBadFrame, an error's message is kept.
func (c *Client) readAhead(a *ahead) error {
	r, err := readResponse(c.rd, c.scratch, c.maxPayload)
	if err != nil {
		return err
	}
	if r.shm {
		return fmt.Errorf("%w: a response in shared memory to a request that did not ask for it", ErrBadFrame)
	}
	c.buf = grow(c.buf, int(r.payloadLen))
	if _, err := io.ReadFull(c.rd, c.buf); err != nil {
		return err
	}
	a.resp, a.msg, a.read = r, "", true
	if r.code != 0 {
		a.msg = string(c.buf)
	}
	return nil
}

// regionHolds reports whether req's payload goes through the
// connection's shared region: one that fits in it.
func (c *Client) regionHolds(req request) bool {
	return c.shm != nil && int(req.payloadLen) <= len(c.shm)
}

// writeRequest writes req's header and its payload on conn: the payload
// from its slices as they are (writev), or copied into the shared
// region when req.shm says it goes there.
func (c *Client) writeRequest(conn net.Conn, req request, payload net.Buffers) error {
	bufs := net.Buffers{nil}
	if req.shm {
		off := 0
		for _, p := range payload {
			off += copy(c.shm[off:], p)
		}
	} else {
		bufs = append(bufs, payload...)
	}
	c.hdr = appendSigned(c.hdr[:0], req, c.auth)
	bufs[0] = c.hdr
	_, err := writeGathered(conn, bufs)
	return err
}

// responseBody returns where resp's payload is to be read from: the
// connection, or the shared region if the server answered there; nil
// with view when it stays in the region. A payload in the region that
// was not asked for, or that overruns it, is ErrBadFrame.
func (c *Client) responseBody(req request, resp response, view bool) (io.Reader, error) {
	switch {
	case resp.shm && (!req.shm || req.op != opPull || resp.code != 0):
		return nil, fmt.Errorf("%w: a response in shared memory to a request that did not ask for it", ErrBadFrame)
	case resp.snap:
		return c.snapshotBody(req, resp, view)
	case resp.shm && int(resp.payloadLen) > len(c.shm):
		return nil, fmt.Errorf("%w: a payload of %d bytes in a shared region of %d", ErrBadFrame, resp.payloadLen, len(c.shm))
	case resp.shm && view:
		return nil, nil
	case resp.shm:
		c.shmRd.Reset(c.shm[:resp.payloadLen])
		return &c.shmRd, nil
	case c.local && resp.code == 0 && req.op == opPull:
		c.shmFit = max(c.shmFit, int(resp.payloadLen)) // the next region holds it
	}
	return c.rd, nil
}

// snapshotBody is responseBody for a payload in a snapshot slot.
func (c *Client) snapshotBody(req request, resp response, view bool) (io.Reader, error) {
	b, ok := c.snaps.at(int(resp.outcome), int(resp.payloadLen))
	if !ok || req.delta {
		return nil, fmt.Errorf("%w: a payload of %d bytes in snapshot slot %d, of %d slots of %d bytes", ErrBadFrame, resp.payloadLen, resp.outcome, c.snaps.slots, c.snaps.size)
	}
	if view {
		return nil, nil
	}
	c.shmRd.Reset(b)
	return &c.shmRd, nil
}

// readBody reads resp's payload from body: straight into dst when the
// response is OK, the sizes agree and the host's float32s are its wire
// bytes (direct), else into c.buf.
func (c *Client) readBody(body io.Reader, resp response, dst [][]float32) (direct bool, err error) {
	if resp.code == 0 && dst != nil && wire.SharesMemory() && int(resp.payloadLen) == segmentsLen(dst) {
		for _, d := range dst {
			if _, err := io.ReadFull(body, wire.Bytes(d)); err != nil {
				return false, err
			}
		}
		c.buf = c.buf[:0]
		return true, nil
	}
	c.buf = grow(c.buf, int(resp.payloadLen))
	_, err = io.ReadFull(body, c.buf)
	return false, err
}

// closedByServer wraps err with errClosedByServer if it says the peer
// closed the connection.
func closedByServer(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w: %w", errClosedByServer, err)
	}
	return err
}

// Pull is ParameterServerClient.Pull over the data plane.
func (c *Client) Pull(ctx context.Context, in *pb.PullRequest, _ ...grpc.CallOption) (*pb.PullResponse, error) {
	return c.pull(ctx, in, nil)
}

// PullInto is Pull that reads the parameters straight into dst, the
// segments of the model that the shard's flat buffer maps to, in order
// (partition.Plan.Segments): no intermediate copy. The response's Params
// is nil then. If the shard sends another number of bytes than dst holds
// (or the host is big-endian), dst is untouched and Params holds what was
// sent, for the caller to scatter or report. A read that fails midway
// leaves dst partly overwritten: pull again.
func (c *Client) PullInto(ctx context.Context, in *pb.PullRequest, dst [][]float32) (*pb.PullResponse, error) {
	return c.pull(ctx, in, dst)
}

// PullView is PullInto, but a payload the server put in the connection's
// shared region (a same-host server, shm.go) stays there: Params is a
// view of the region, and dst is untouched. Params, a view or the
// client's buffer, is valid until the client's next call: the server
// writes the region only to answer a request, the client reads its
// buffer only for one.
func (c *Client) PullView(ctx context.Context, in *pb.PullRequest, dst [][]float32) (*pb.PullResponse, error) {
	return c.pullView(ctx, in, dst, true)
}

func (c *Client) pull(ctx context.Context, in *pb.PullRequest, dst [][]float32) (*pb.PullResponse, error) {
	return c.pullView(ctx, in, dst, false)
}

func (c *Client) pullView(ctx context.Context, in *pb.PullRequest, dst [][]float32, view bool) (*pb.PullResponse, error) {
	resp, body, err := c.call(ctx, request{op: opPull, retain: in.Retain, runID: in.RunId, worker: in.Worker, version: in.MinVersion,
		generation: in.Generation, delta: in.Delta, dataPos: in.DeltaBase}, nil, dst, view)
	if err != nil {
		return nil, err
	}
	return &pb.PullResponse{Version: resp.version, Params: body, Done: resp.done, Generation: resp.generation,
		DataPosition: resp.dataPosition}, nil
}

// Push is ParameterServerClient.Push over the data plane.
func (c *Client) Push(ctx context.Context, in *pb.PushRequest, _ ...grpc.CallOption) (*pb.PushResponse, error) {
	return c.push(ctx, in, net.Buffers{in.Grad})
}

// PushSegments is Push with the gradient given as the segments of the
// model's gradients that make up the shard's flat buffer, in order; they
// are written as they are, not copied. in.Grad is ignored.
func (c *Client) PushSegments(ctx context.Context, in *pb.PushRequest, segs [][]float32) (*pb.PushResponse, error) {
	return c.push(ctx, in, segmentBuffers(segs))
}

// segmentBuffers is segs as the bytes a push writes.
func segmentBuffers(segs [][]float32) net.Buffers {
	bufs := make(net.Buffers, len(segs))
	for i, s := range segs {
		bufs[i] = wire.Bytes(s)
	}
	return bufs
}

func (c *Client) push(ctx context.Context, in *pb.PushRequest, payload net.Buffers) (*pb.PushResponse, error) {
	resp, _, err := c.call(ctx, request{op: opPush, runID: in.RunId, worker: in.Worker, version: in.Version,
		generation: in.Generation, loss: in.Loss, dataPos: in.DataPosition}, payload, nil, false)
	if err != nil {
		return nil, err
	}
	return &pb.PushResponse{Outcome: pb.PushResponse_Outcome(resp.outcome), Version: resp.version, Done: resp.done}, nil
}

// String names the client for logs.
func (c *Client) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("dataplane client of %s", c.addr)
}

// DialTCP dials the data plane at addr over TCP and, with a TLS config,
// runs its handshake and switch to records (the mode WithPrivacy put in
// cfg, else encrypt): the connection carries raw frames, for tools and
// tests that write their own.
func DialTCP(ctx context.Context, addr string, cfg *tls.Config) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil || cfg == nil {
		return conn, err
	}
	c := &Client{addr: addr, tls: cfg}
	return c.handshakeTLS(ctx, conn)
}
