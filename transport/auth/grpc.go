package auth

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
)

// Metadata keys.
const (
	mdAuth     = "pstrain-auth"     // a session call's credential
	mdRegister = "pstrain-register" // a registration's proof
	mdSession  = "pstrain-session"  // the chief's answer: the new session
)

// Guard is the server side: it checks every call before its handler.
type Guard struct {
	Keys *Keyring
	// Now is the clock registrations are checked against (time.Now when
	// nil).
	Now func() time.Time
	// Refused, when set, is told the reason of every refused call.
	Refused func(reason string)
}

// Unary is the interceptor to install with grpc.ChainUnaryInterceptor.
func (g *Guard) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == pb.Chief_Register_FullMethodName {
			return g.register(ctx, req, handler)
		}
		if err := g.check(ctx, req, info.FullMethod); err != nil {
			return nil, g.refused(err)
		}
		return handler(ctx, req)
	}
}

func (g *Guard) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

func (g *Guard) check(ctx context.Context, req any, method string) error {
	cred := first(ctx, mdAuth)
	if cred == "" {
		return refuse(ReasonNoCredential, "%s needs a session credential: register with the chief first (is this client a task of the run?)", method)
	}
	id, err := g.Keys.VerifyCall(cred, method)
	if err != nil {
		return err
	}
	if err := CheckCertificate(PeerCertName(ctx), id); err != nil {
		return err
	}
	return Allow(id, method, req)
}

// register verifies a registration's proof and, when the chief accepts
// the task, issues it a session in the response header.
func (g *Guard) register(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
	proof := first(ctx, mdRegister)
	if proof == "" {
		return nil, g.refused(refuse(ReasonNoCredential, "registration refused: it carries no proof of the run's token (start the task with --auth-token-file)"))
	}
	id, err := g.Keys.VerifyRegister(proof, g.now())
	if err != nil {
		return nil, g.refused(err)
	}
	if r, _ := req.(*pb.RegisterRequest); r.GetRole() != id.Role || int64(r.GetIndex()) != int64(id.Index) {
		return nil, g.refused(refuse(ReasonForbidden, "registration refused: the proof is for %s, the request for %s/%d", id.Task(), r.GetRole(), r.GetIndex()))
	}
	if err := CheckCertificate(PeerCertName(ctx), id); err != nil {
		return nil, g.refused(err)
	}
	resp, err := handler(ctx, req)
	if err != nil {
		return resp, err
	}
	s, err := NewSession()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs(mdSession, strconv.FormatUint(s, 16))); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return resp, nil
}

func (g *Guard) refused(err error) error {
	r := Reason(err)
	if g.Refused != nil {
		g.Refused(r)
	}
	code := codes.Unauthenticated
	if r == ReasonForbidden || r == ReasonCertificate {
		code = codes.PermissionDenied
	}
	return status.Error(code, err.Error())
}

func first(ctx context.Context, key string) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

// PeerCertName is the common name of the call's verified client
// certificate ("" without TLS).
func PeerCertName(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return ""
	}
	return ti.State.PeerCertificates[0].Subject.CommonName
}

// NewSession is a random nonzero session number.
func NewSession() (uint64, error) {
	for {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("auth: making a session: %w", err)
		}
		if s := binary.LittleEndian.Uint64(b[:]); s != 0 {
			return s, nil
		}
	}
}

// Client is a task's side: it proves the token when registering, keeps
// the session the chief issued and signs every later call with it. The
// chief, which issues sessions, starts with its own (SetSession).
type Client struct {
	Keys  *Keyring
	Role  string
	Index int
	// Now is the registration's clock (time.Now when nil).
	Now func() time.Time

	session atomic.Uint64
}

// ErrNoSession is returned by a call made before registration.
var ErrNoSession = errors.New("auth: no session yet: the task has not registered with the chief")

// SetSession sets the session calls are signed with.
func (c *Client) SetSession(s uint64) { c.session.Store(s) }

// Identity is the client's current identity (Session 0 before
// registration).
func (c *Client) Identity() Identity {
	return Identity{Role: c.Role, Index: c.Index, Session: c.session.Load()}
}

// Unary is the interceptor to install with grpc.WithChainUnaryInterceptor.
func (c *Client) Unary() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == pb.Chief_Register_FullMethodName {
			now := time.Now
			if c.Now != nil {
				now = c.Now
			}
			var hdr metadata.MD
			ctx = metadata.AppendToOutgoingContext(ctx, mdRegister, c.Keys.RegisterProof(c.Role, c.Index, now()))
			if err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&hdr))...); err != nil {
				return err
			}
			v := hdr.Get(mdSession)
			if len(v) == 0 {
				return status.Error(codes.Unauthenticated, "the chief issued no session: is it an older pstrain without authentication?")
			}
			s, err := strconv.ParseUint(v[0], 16, 64)
			if err != nil || s == 0 {
				return status.Errorf(codes.Unauthenticated, "the chief issued a malformed session %q", v[0])
			}
			c.SetSession(s)
			return nil
		}
		id := c.Identity()
		if id.Session == 0 {
			return status.Error(codes.FailedPrecondition, ErrNoSession.Error())
		}
		ctx = metadata.AppendToOutgoingContext(ctx, mdAuth, c.Keys.CallCredential(id, method))
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}
