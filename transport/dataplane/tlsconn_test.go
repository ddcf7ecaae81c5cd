package dataplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	pb "github.com/pstrain/pstrain/proto"
)

// BenchmarkTCPPushPull is one worker's push and pull of a default
// shard's 1.27 MB over TCP (the address named "localhost", so no
// same-host socket), plain, mutual TLS (the encrypt mode) and
// integrity-only: what TLS costs the data plane between hosts, without
// the network.
func BenchmarkTCPPushPull(b *testing.B) {
	for _, mode := range []string{"plain", "tls", "integrity"} {
		withTLS := mode != "plain"
		b.Run(mode, func(b *testing.B) {
			ca := newTestCA(b)
			e := &echoBackend{}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			cfg := Config{MaxPayload: 8 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			var ctls *tls.Config
			if withTLS {
				cfg.TLS, _ = ca.configs(b, "ps-0")
				_, ctls = ca.configs(b, "worker-0")
			}
			if mode == "integrity" {
				cfg.TLS, ctls = WithPrivacy(cfg.TLS, true), WithPrivacy(ctls, true)
			}
			s := NewServer(e, lis, cfg)
			go s.Serve()
			defer s.Close()
			addr := strings.Replace(lis.Addr().String(), "127.0.0.1", "localhost", 1)
			c := NewClient(func(context.Context) (string, error) { return addr, nil }, ctls, 8<<20)
			defer c.Close()
			grad := make([]byte, 1270000)
			b.SetBytes(2 * int64(len(grad)))
			b.ResetTimer()
			for range b.N {
				if _, err := c.Push(context.Background(), &pb.PushRequest{Grad: grad, RunId: "r"}); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Pull(context.Background(), &pb.PullRequest{RunId: "r"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Over TLS on TCP, with configurations that name no mode, frames larger
// than a record and small ones arrive whole and in order, both ways, in
// the encrypt mode's sealed records.
func TestTLSOverTCPRunsSealedRecords(t *testing.T) {
	ca := newTestCA(t)
	e := &echoBackend{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stls, _ := ca.configs(t, "ps-0")
	_, ctls := ca.configs(t, "worker-0")
	s := NewServer(e, lis, Config{MaxPayload: 8 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), TLS: stls})
	serveTest(t, s)
	addr := strings.Replace(lis.Addr().String(), "127.0.0.1", "localhost", 1) // a name: no same-host socket
	c := NewClient(func(context.Context) (string, error) { return addr, nil }, ctls, 8<<20)
	defer c.Close()
	echoRoundTrips(t, c, 3*maxRecord+12345, 10, 0, maxRecord, 1<<20)
	c.mu.Lock()
	mc, ok := c.conn.(*recordLayer)
	c.mu.Unlock()
	if !ok || !mc.sealed {
		t.Fatalf("the connection is %T, want sealed records", c.conn)
	}
}

// echoRoundTrips pushes a payload of each size to an echo backend and
// pulls it back, byte for byte.
func echoRoundTrips(t *testing.T, c *Client, sizes ...int) {
	t.Helper()
	for i, n := range sizes {
		grad := make([]byte, n)
		for j := range grad {
			grad[j] = byte(i + j*7)
		}
		if _, err := c.Push(context.Background(), &pb.PushRequest{Grad: grad, RunId: "r"}); err != nil {
			t.Fatal(err)
		}
		pr, err := c.Pull(context.Background(), &pb.PullRequest{RunId: "r"})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(pr.Params, grad) {
			t.Fatalf("push %d of %d bytes came back as %d different bytes", i, n, len(pr.Params))
		}
	}
}

// A TLS client that names no mode in ALPN (one that would talk TLS's
// own records) is cut after its handshake, before it is served.
func TestRecordsRefuseClientNamingNoMode(t *testing.T) {
	ca := newTestCA(t)
	e := &echoBackend{}
	addr := integrityServer(t, ca, e, false)
	_, ctls := ca.configs(t, "worker-0")
	ctls = ctls.Clone()
	ctls.NextProtos, ctls.ServerName = nil, "localhost"
	conn, err := tls.Dial("tcp", strings.Replace(addr, "localhost", "127.0.0.1", 1), ctls)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write(bytes.Repeat([]byte{1}, 64))
	if n, err := conn.Read(make([]byte, 64)); err == nil || n > 0 {
		t.Fatalf("a client naming no mode read %d bytes, %v; want the connection cut", n, err)
	}
	if n := e.count(); n != 0 {
		t.Fatalf("the backend saw %d requests", n)
	}
}

// keysOf derives keys only from a full TLS 1.3 handshake: a connection
// of another version, or a resumed session, is refused whatever the
// configuration that made it (the refusal comes before the exporter,
// which such a state here does not even have).
func TestKeysOfRefusesOtherThanFullTLS13(t *testing.T) {
	for name, cs := range map[string]tls.ConnectionState{
		"TLS 1.2":         {Version: tls.VersionTLS12, NegotiatedProtocol: protoSealed},
		"resumed TLS 1.3": {Version: tls.VersionTLS13, DidResume: true, NegotiatedProtocol: protoSealed},
	} {
		if _, err := keysOf(cs, protoSealed, true); err == nil || !strings.Contains(err.Error(), "full TLS 1.3") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}

// A real handshake's state passes keysOf's check: both ends derive the
// same two keys, crossed.
func TestKeysOfAcceptsFullTLS13(t *testing.T) {
	ca := newTestCA(t)
	stls, _ := ca.configs(t, "ps-0")
	_, ctls := ca.configs(t, "worker-0")
	stls, ctls = WithPrivacy(stls, false), WithPrivacy(ctls, false)
	ctls.ServerName = "localhost"
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	sc, cc := tls.Server(a, stls), tls.Client(b, ctls)
	errc := make(chan error, 1)
	go func() { errc <- sc.Handshake() }()
	if err := cc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	ck, err := keysOf(cc.ConnectionState(), protoSealed, true)
	if err != nil {
		t.Fatal(err)
	}
	sk, err := keysOf(sc.ConnectionState(), protoSealed, false)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ck.send, sk.recv) || !bytes.Equal(ck.recv, sk.send) || bytes.Equal(ck.send, ck.recv) {
		t.Fatal("the two ends' keys do not cross")
	}
}

// A key a direction moved on from is zeroed, on both ends; the keys
// the layer was made with are its own copies, left as they were.
func TestRecordsZeroOldKeys(t *testing.T) {
	var wire bytes.Buffer
	k := bytes.Repeat([]byte{3}, sealKeyLen)
	w, err := newRecordLayer(recordKeys{sealed: true, send: k, recv: k}, &wire, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRecordLayer(recordKeys{sealed: true, send: k, recv: k}, nil, &wire)
	if err != nil {
		t.Fatal(err)
	}
	w.rekey, r.rekey = 2, 2
	oldSend, oldRecv := w.sendKey, r.recvKey
	for _, m := range []string{"a", "b", "c"} { // the third under the next key
		if _, err := w.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := io.ReadAll(io.LimitReader(r, 3)); err != nil || string(got) != "abc" {
		t.Fatalf("read %q, %v", got, err)
	}
	if bytes.Count(oldSend, []byte{0}) != sealKeyLen || bytes.Count(oldRecv, []byte{0}) != sealKeyLen {
		t.Fatalf("the first keys were not zeroed: %x, %x", oldSend, oldRecv)
	}
	if bytes.Equal(w.sendKey, oldSend) || !bytes.Equal(w.sendKey, r.recvKey) {
		t.Fatal("the two ends did not move on to the same next key")
	}
	if !bytes.Equal(k, bytes.Repeat([]byte{3}, sealKeyLen)) {
		t.Fatal("the caller's key was changed")
	}
}
