package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
)

// Backend is what a parameter server answers on the data plane;
// *ps.Server implements it (the same handlers serve gRPC).
type Backend interface {
	// PullShared answers a pull whose parameters the server may read
	// until it calls release, exactly once, after writing them.
	PullShared(context.Context, *pb.PullRequest) (resp *pb.PullResponse, release func(), err error)
	Push(context.Context, *pb.PushRequest) (*pb.PushResponse, error)
}

// Server serves a Backend on a listener (wrap it with tls.NewListener for
// TLS).
type Server struct {
	b          Backend
	lis        net.Listener
	maxPayload int
	log        *slog.Logger
	keys       *auth.Keyring       // nil: requests need no credential
	refused    func(reason string) // told every refused request's reason

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a server for b on lis; payloads above maxPayload bytes
// are refused and their connection closed.
func NewServer(b Backend, lis net.Listener, maxPayload int, log *slog.Logger) *Server {
	return &Server{b: b, lis: lis, maxPayload: maxPayload, log: log, conns: map[net.Conn]struct{}{}}
}

// RequireAuth makes the server refuse every request without a valid
// session credential of keys (or one its sender may not make: see
// auth.AllowPull and auth.AllowPush), before reading its payload, and
// close the connection; refused, when set, is told the reason. Call
// before Serve.
func (s *Server) RequireAuth(keys *auth.Keyring, refused func(reason string)) {
	s.keys, s.refused = keys, refused
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Serve accepts connections until Close. It returns nil after Close. An
// accept error (e.g. out of file descriptors) is logged and retried with
// backoff, as net/http does, so the data plane never stops quietly.
func (s *Server) Serve() error {
	backoff := 5 * time.Millisecond
	for {
		c, err := s.lis.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			s.log.Warn("data plane: accept failed; retrying", "err", err, "in", backoff)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops accepting, closes every connection and waits for their
// handlers.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	err := s.lis.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// serveConn answers one connection's requests in order. The gradient is
// read into a buffer reused for every push on the connection, and a pull
// writes the shard's immutable parameter snapshot straight to the socket.
func (s *Server) serveConn(c net.Conn) {
	defer c.Close()
	if tc, ok := c.(*tls.Conn); ok {
		// Like gRPC's: a client that never finishes the handshake does not
		// hold the connection forever.
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			s.log.Warn("data plane: TLS handshake refused", "remote", c.RemoteAddr(), "err", err)
			return
		}
		tc.SetDeadline(time.Time{})
	}
	rd := bufio.NewReaderSize(c, 64<<10)
	scratch := make([]byte, 512)
	hdr := make([]byte, 0, respLen)
	var payload []byte
	for {
		req, err := readRequest(rd, scratch, s.maxPayload)
		if err != nil {
			if errors.Is(err, ErrBadFrame) {
				s.log.Warn("data plane: closing a connection that sent a bad frame", "remote", c.RemoteAddr(), "err", err)
				s.writeError(c, hdr, codes.InvalidArgument, err.Error())
			}
			return
		}
		if err := s.authorize(c, req); err != nil {
			if s.refused != nil {
				s.refused(auth.Reason(err))
			}
			s.log.Warn("data plane: refused a request", "remote", c.RemoteAddr(), "err", err)
			code := codes.PermissionDenied
			if r := auth.Reason(err); r == auth.ReasonNoCredential || r == auth.ReasonBadCredential {
				code = codes.Unauthenticated
			}
			s.writeError(c, hdr, code, err.Error())
			return
		}
		payload = grow(payload, int(req.payloadLen))
		if _, err := io.ReadFull(rd, payload); err != nil {
			return
		}
		var resp response
		var body []byte
		release := func() {}
		switch req.op {
		case opPull:
			pr, done, err := s.pull(c, rd, req)
			if err != nil {
				if errors.Is(err, errGone) {
					return
				}
				st := status.Convert(err)
				resp.code, body = byte(st.Code()), []byte(st.Message())
				break
			}
			resp.version, resp.generation, resp.done, body = pr.Version, pr.Generation, pr.Done, pr.Params
			resp.dataPosition = pr.DataPosition
			release = done
		case opPush:
			pr, err := s.b.Push(context.Background(), &pb.PushRequest{Worker: req.worker, Version: req.version,
				Grad: payload, RunId: req.runID, Loss: req.loss, Generation: req.generation, DataPosition: req.dataPos})
			if err != nil {
				st := status.Convert(err)
				resp.code, body = byte(st.Code()), []byte(st.Message())
				break
			}
			resp.outcome, resp.version, resp.done = byte(pr.Outcome), pr.Version, pr.Done
		}
		resp.payloadLen = uint32(len(body))
		bufs := net.Buffers{appendResponse(hdr[:0], resp), body}
		_, err = bufs.WriteTo(c)
		release()
		if err != nil {
			return
		}
	}
}

// authorize checks req's credential (when the server requires one) and
// that its sender may make it.
func (s *Server) authorize(c net.Conn, req request) error {
	if s.keys == nil {
		return nil
	}
	if req.id.Role == "" {
		return &auth.Error{Reason: auth.ReasonNoCredential, Msg: "the data plane needs a session credential: register with the chief first (is this client a task of the run?)"}
	}
	if err := s.keys.VerifyFrame(req.id, req.signed, req.mac); err != nil {
		return err
	}
	if err := auth.CheckCertificate(peerCertName(c), req.id); err != nil {
		return err
	}
	if req.op == opPush {
		return auth.AllowPush(req.id, req.worker)
	}
	return auth.AllowPull(req.id, req.worker)
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

// errGone means the client went away while its pull was blocked.
var errGone = errors.New("dataplane: client gone")

// pull runs a (possibly long-blocking) pull, cancelling it if the client
// closes the connection meanwhile. Clients never send while a request is
// outstanding, so any read that returns during the pull means the client
// is gone (or broke the protocol). On success the caller calls release
// once the parameters are written.
func (s *Server) pull(c net.Conn, rd *bufio.Reader, req request) (resp *pb.PullResponse, release func(), err error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := make(chan bool, 1) // true: the client is gone
	go func() {
		_, err := rd.Peek(1)
		var ne net.Error
		gone := !(errors.As(err, &ne) && ne.Timeout())
		if gone {
			cancel()
		}
		watched <- gone
	}()
	resp, release, err = s.b.PullShared(ctx, &pb.PullRequest{Worker: req.worker, MinVersion: req.version, RunId: req.runID,
		Generation: req.generation, Retain: req.retain})
	// Stop the watcher: a read deadline in the past wakes it.
	c.SetReadDeadline(time.Unix(1, 0))
	gone := <-watched
	c.SetReadDeadline(time.Time{})
	if gone {
		if err == nil {
			release()
		}
		return nil, nil, errGone
	}
	return resp, release, err
}

func (s *Server) writeError(c net.Conn, hdr []byte, code codes.Code, msg string) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	bufs := net.Buffers{appendResponse(hdr[:0], response{code: byte(code), payloadLen: uint32(len(msg))}), []byte(msg)}
	bufs.WriteTo(c)
}
