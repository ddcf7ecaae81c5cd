package dataplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/certs"
)

// testCA is a cluster CA for the tests.
type testCA struct {
	ca   *certs.Authority
	pool *x509.CertPool
}

func newTestCA(t testing.TB) testCA {
	t.Helper()
	ca, err := certs.NewAuthority("test CA", certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return testCA{ca: ca, pool: pool}
}

// configs are name's server and client TLS configurations, as tlsconf
// makes them.
func (c testCA) configs(t testing.TB, name string) (server, client *tls.Config) {
	t.Helper()
	is, err := c.ca.Issue(name, certs.LoopbackHosts(), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	server = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{kp}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: c.pool}
	client = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{kp}, RootCAs: c.pool}
	return server, client
}

var testToken = auth.Token("the run's token, thirty-two bytes or more")

// tlsServer serves e over TLS as ps-0, requiring sessions of keys, on a
// loopback address (so with a same-host socket), after setup has seen it.
func tlsServer(t *testing.T, ca testCA, e Backend, keys *auth.Keyring, setup func(*Server)) (*Server, string, *metrics.PS) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the same-host socket is Linux's")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stls, _ := ca.configs(t, "ps-0")
	m := metrics.NewPS(prometheus.NewRegistry())
	s := NewServer(e, lis, Config{MaxPayload: 8 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: m, Auth: keys, TLS: stls})
	if setup != nil {
		setup(s)
	}
	serveTest(t, s)
	return s, lis.Addr().String(), m
}

// tlsClient is a client with name's certificate (none: ctls nil)
// signing as role/index under keys.
func tlsClient(addr string, ctls *tls.Config, keys *auth.Keyring, role string, index int) *Client {
	c := NewClient(func(context.Context) (string, error) { return addr, nil }, ctls, 8<<20)
	who := &auth.Client{Keys: keys, Role: role, Index: index}
	who.SetSession(uint64(77 + index))
	c.SignWith(who)
	return c
}

func pushAs(c *Client, worker int32, n int) error {
	_, err := c.Push(context.Background(), &pb.PushRequest{Worker: worker, RunId: "r", Grad: bytes.Repeat([]byte{7}, n)})
	return err
}

// Under TLS, a same-host client with the cluster's certificate talks
// over the Unix socket with its payloads in shared memory, and its
// frames are bound to its certificate's name as over TLS.
func TestSameHostUnderTLSKeepsTheSocketAndTheRegion(t *testing.T) {
	ca := newTestCA(t)
	keys := auth.NewKeyring(testToken)
	e := &echoBackend{}
	s, addr, m := tlsServer(t, ca, e, keys, nil)
	_, w0 := ca.configs(t, "worker-0")
	c := tlsClient(addr, w0, keys, auth.RoleWorker, 0)
	defer c.Close()
	if err := pushAs(c, 0, 3<<20); err != nil {
		t.Fatal(err)
	}
	pr, err := c.Pull(context.Background(), &pb.PullRequest{Worker: 0, RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pr.Params, bytes.Repeat([]byte{7}, 3<<20)) || e.count() != 1 { // the echo's parameters are the push
		t.Fatalf("pulled %d bytes, not the 3 MiB pushed; %d pushes", len(pr.Params), e.count())
	}
	if shm, _ := clientShm(c); connNetwork(t, c) != localNetwork || shm == nil || s.inShm.Load() != 2 {
		t.Fatalf("network %q, region %v, payloads in the region %d: want the Unix socket with both payloads in a region",
			connNetwork(t, c), shm != nil, s.inShm.Load())
	}

	// worker-1's certificate cannot push as worker 0 on the socket either.
	_, w1 := ca.configs(t, "worker-1")
	c1 := tlsClient(addr, w1, keys, auth.RoleWorker, 0)
	defer c1.Close()
	if err := pushAs(c1, 0, 64); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "worker-1") {
		t.Fatalf("worker-1's certificate pushing as worker 0: %v, want PermissionDenied naming it", err)
	}
	if n := rejectedFor(m, auth.ReasonCertificate); n != 1 || e.count() != 1 {
		t.Fatalf("%v certificate refusals, %d pushes applied; want 1 and 1", n, e.count())
	}
}

// A same-host client without the session credentials is refused on the
// socket: without a certificate (a plaintext task), with a frame under
// another token (a wrong MAC), or unsigned; nothing reaches the backend.
func TestSameHostUnderTLSRefusesWhatTLSRefuses(t *testing.T) {
	ca := newTestCA(t)
	keys := auth.NewKeyring(testToken)
	e := &echoBackend{}
	_, addr, m := tlsServer(t, ca, e, keys, nil)
	_, w0 := ca.configs(t, "worker-0")

	plain := tlsClient(addr, nil, keys, auth.RoleWorker, 0) // the token, no certificate
	defer plain.Close()
	if err := pushAs(plain, 0, 64); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "mutual TLS") {
		t.Fatalf("a client without a certificate: %v, want Unauthenticated saying mutual TLS", err)
	}
	if rejectedFor(m, auth.ReasonCertificate) < 1 {
		t.Fatal("the certificate-less client was not counted")
	}

	other := auth.NewKeyring(auth.Token("another run's token, thirty-two bytes or more"))
	wrongMAC := tlsClient(addr, w0, other, auth.RoleWorker, 0)
	defer wrongMAC.Close()
	if err := pushAs(wrongMAC, 0, 64); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a frame under another token: %v, want Unauthenticated", err)
	}
	if connNetwork(t, wrongMAC) != localNetwork || rejectedFor(m, auth.ReasonBadCredential) != 1 {
		t.Fatalf("the wrong MAC went over %q and was counted %v times; want the Unix socket, once", connNetwork(t, wrongMAC), rejectedFor(m, auth.ReasonBadCredential))
	}

	unsigned := NewClient(func(context.Context) (string, error) { return addr, nil }, w0, 8<<20)
	defer unsigned.Close()
	if err := pushAs(unsigned, 0, 64); status.Code(err) != codes.Unauthenticated || rejectedFor(m, auth.ReasonNoCredential) != 1 {
		t.Fatalf("an unsigned frame: %v, counted %v", err, rejectedFor(m, auth.ReasonNoCredential))
	}
	if e.count() != 0 {
		t.Fatalf("%d pushes reached the backend", e.count())
	}
}

// A certificate from another CA fails the exchange; the client then
// tries TLS over TCP, which fails too, and nothing is applied.
func TestSameHostUnderTLSRefusesAnotherCA(t *testing.T) {
	ca := newTestCA(t)
	keys := auth.NewKeyring(testToken)
	e := &echoBackend{}
	s, addr, m := tlsServer(t, ca, e, keys, nil)
	_, foreign := newTestCA(t).configs(t, "worker-0")

	conn := dialUnix(t, addr)
	p, _ := peerOf(conn)
	la := localAuthOf(foreign, foreign.RootCAs)
	_, err := la.clientExchange(conn, os.Getpid(), p, os.Geteuid(), time.Now())
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("another CA's client: %v, want the server's certificate refused", err)
	}
	// The client refuses the server first (not under its CA); a client
	// that trusted it would be refused by the server: signed with its
	// own key, verified against the cluster's CA.
	la.Roots = ca.pool
	conn2 := dialUnix(t, addr)
	if _, err := la.clientExchange(conn2, os.Getpid(), p, os.Geteuid(), time.Now()); !errors.Is(err, errLocalRefused) {
		t.Fatalf("another CA's certificate: %v, want refused", err)
	}
	c := tlsClient(addr, foreign, keys, auth.RoleWorker, 0)
	defer c.Close()
	if err := pushAs(c, 0, 64); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("push with another CA's certificate: %v, want Unavailable with the TLS error", err)
	}
	eventually(t, "the refused handshakes counted", func() bool { return closedFor(m, "tls") >= 2 })
	if e.count() != 0 || s.regions.Load() != 0 {
		t.Fatalf("%d pushes applied, %d regions mapped", e.count(), s.regions.Load())
	}
}

// The exchange is bound to the processes the kernel reports: a peer of
// another user is refused, and so is a signature naming another process
// than the socket's other end (a relay between a client and the server).
func TestSameHostExchangeIsBoundToTheKernelsPeer(t *testing.T) {
	ca := newTestCA(t)
	keys := auth.NewKeyring(testToken)
	e := &echoBackend{}
	_, addr, _ := tlsServer(t, ca, e, keys, nil)
	_, w0 := ca.configs(t, "worker-0")
	la := localAuthOf(w0, w0.RootCAs)

	conn := dialUnix(t, addr)
	p, _ := peerOf(conn)
	if _, err := la.clientExchange(conn, os.Getpid()+1, p, os.Geteuid(), time.Now()); !errors.Is(err, errLocalRefused) {
		t.Fatalf("a client signing another pid than its own: %v, want refused", err)
	}
	conn = dialUnix(t, addr)
	relay := peerProc{uid: p.uid, pid: p.pid + 1} // the server is not the process the client reaches
	if _, err := la.clientExchange(conn, os.Getpid(), relay, os.Geteuid(), time.Now()); err == nil || !strings.Contains(err.Error(), "process") {
		t.Fatalf("a server that is not the socket's other end: %v, want refused naming the process", err)
	}
	conn = dialUnix(t, addr)
	if name, err := la.clientExchange(conn, os.Getpid(), p, os.Geteuid(), time.Now()); err != nil || name != "ps-0" {
		t.Fatalf("the honest exchange: %q, %v", name, err)
	}
}

// A server whose peer runs as another user takes no exchange: the
// client goes over TLS on TCP and its push is applied there.
func TestSameHostUnderTLSFromAnotherUserGoesOverTCP(t *testing.T) {
	ca := newTestCA(t)
	keys := auth.NewKeyring(testToken)
	e := &echoBackend{}
	s, addr, m := tlsServer(t, ca, e, keys, func(s *Server) { s.uid = os.Geteuid() + 1 })
	_, w0 := ca.configs(t, "worker-0")
	c := tlsClient(addr, w0, keys, auth.RoleWorker, 0)
	defer c.Close()
	if err := pushAs(c, 0, 64); err != nil {
		t.Fatal(err)
	}
	if n := connNetwork(t, c); n != "tcp" || e.count() != 1 || s.regions.Load() != 0 {
		t.Fatalf("network %q, %d pushes, %d regions: want TCP, 1, 0", n, e.count(), s.regions.Load())
	}
	eventually(t, "the refused exchange counted", func() bool { return closedFor(m, "tls") >= 1 })
}

// Garbage in the exchange closes the connection and leaves the server
// serving.
func TestSameHostExchangeGarbage(t *testing.T) {
	ca := newTestCA(t)
	keys := auth.NewKeyring(testToken)
	e := &echoBackend{}
	_, addr, m := tlsServer(t, ca, e, keys, nil)
	for i, junk := range [][]byte{
		append(localMagic[:4:4], bytes.Repeat([]byte{0xff}, 64)...),                                  // a chain of 255 certificates
		append(append(localMagic[:4:4], make([]byte, 36)...), 1, 0xff, 0xff, 0xff, 0x7f),             // a 2 GiB certificate
		append(append(localMagic[:4:4], make([]byte, 36)...), 1, 8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8), // not DER
		[]byte("GET / HTTP/1.1\r\n\r\n"),
	} {
		conn := dialUnix(t, addr)
		conn.Write(junk)
		if !closedByPeer(conn, 5*time.Second) {
			t.Fatalf("junk %d: the connection stayed open", i)
		}
	}
	eventually(t, "the garbage counted", func() bool { return closedFor(m, "tls")+rejectedFor(m, auth.ReasonCertificate) >= 4 })
	_, w0 := ca.configs(t, "worker-0")
	c := tlsClient(addr, w0, keys, auth.RoleWorker, 0)
	defer c.Close()
	if err := pushAs(c, 0, 64); err != nil || e.count() != 1 {
		t.Fatalf("after the garbage: %v, %d pushes", err, e.count())
	}
}

func TestReadHelloBoundsWhatItReads(t *testing.T) {
	for _, b := range [][]byte{
		nil,
		make([]byte, 36),
		append(make([]byte, 36), 0),
		append(make([]byte, 36), maxLocalChain+1),
		append(make([]byte, 36), 1, 0, 0, 1, 0), // 64 KiB certificate
	} {
		if _, err := readHello(bytes.NewReader(b)); err == nil {
			t.Errorf("readHello(%x) accepted", b)
		}
	}
}

func FuzzReadHello(f *testing.F) {
	f.Add(append(make([]byte, 36), 1, 3, 0, 0, 0, 1, 2, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := readHello(bytes.NewReader(b))
		if err != nil {
			return
		}
		n := 0
		for _, c := range h.chain {
			n += len(c)
		}
		if n > len(b) || len(h.chain) > maxLocalChain {
			t.Fatalf("a hello of %d bytes gave %d certificates of %d bytes", len(b), len(h.chain), n)
		}
	})
}
