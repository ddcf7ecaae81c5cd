package tlsconf

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/syncbuf"
	"github.com/pstrain/pstrain/transport/certs"
)

var loopSpec = cluster.Spec{Chief: []string{"127.0.0.1:1"}, PS: []string{"127.0.0.1:2"}, Worker: []string{"127.0.0.1:3"}}

func makeDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := certs.Generate(dir, loopSpec, nil, certs.Options{}, false); err != nil {
		t.Fatal(err)
	}
	return dir
}

func load(t *testing.T, dir string, task cluster.Task) *Config {
	t.Helper()
	c, err := Load(InDir(dir, task))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serve starts a gRPC health server over mutual TLS on a real loopback
// port and returns its address.
func serve(t *testing.T, c *Config, log *slog.Logger) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(c.ServerCredentials(log, 0, nil)))
	healthpb.RegisterHealthServer(g, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return lis.Addr().String()
}

func check(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestMutualTLSOverLoopback(t *testing.T) {
	dir, other := makeDir(t), makeDir(t)
	var logs syncbuf.Buffer
	srvCfg := load(t, dir, cluster.Task{Type: cluster.PS})
	addr := serve(t, srvCfg, slog.New(slog.NewTextHandler(&logs, nil)))

	// A task of the same cluster gets through.
	worker := load(t, dir, cluster.Task{Type: cluster.Worker})
	if err := check(t, addr, worker.ClientCredentials()); err != nil {
		t.Fatalf("valid client refused: %v", err)
	}

	noCert := worker.ClientTLS()
	noCert.Certificates = nil
	foreign := load(t, other, cluster.Task{Type: cluster.Worker})
	trustsServerOnly := foreign.ClientTLS() // foreign client cert, but trusts our CA
	trustsServerOnly.RootCAs = worker.ClientTLS().RootCAs
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
		// want is in the client's error when the client itself refuses.
		// When the server refuses (TLS 1.3 verifies the client certificate
		// after the client's side of the handshake), the client sees
		// either the alert or a broken connection, depending on timing.
		want string
	}{
		{"no client certificate", credentials.NewTLS(noCert), ""},
		{"client certificate from another CA", credentials.NewTLS(trustsServerOnly), ""},
		{"server not trusted (wrong CA)", foreign.ClientCredentials(), "certificate signed by unknown authority"},
		{"plaintext", insecure.NewCredentials(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := strings.Count(logs.String(), "TLS handshake refused")
			err := check(t, addr, tc.creds)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("got %v, want Unavailable", err)
			}
			if tc.want != "" && (!IsTLSError(err) || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("client error %q: IsTLSError %v, want a TLS error with %q", err, IsTLSError(err), tc.want)
			}
			// The server says so too (its handshake may end just after the client's).
			deadline := time.Now().Add(5 * time.Second)
			for strings.Count(logs.String(), "TLS handshake refused") == before {
				if time.Now().After(deadline) {
					t.Fatalf("server logged no refusal:\n%s", logs.String())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	// Still serving valid clients after all that.
	if err := check(t, addr, worker.ClientCredentials()); err != nil {
		t.Fatalf("valid client refused after bad ones: %v", err)
	}
}

func TestServerNameIsChecked(t *testing.T) {
	dir := t.TempDir()
	// ps-0's certificate names only 10.9.9.9 and the loopback names.
	spec := cluster.Spec{Chief: []string{"127.0.0.1:1"}, PS: []string{"10.9.9.9:2"}, Worker: []string{"127.0.0.1:3"}}
	if _, err := certs.Generate(dir, spec, nil, certs.Options{}, false); err != nil {
		t.Fatal(err)
	}
	addr := serve(t, load(t, dir, cluster.Task{Type: cluster.PS}), nil)
	c := load(t, dir, cluster.Task{Type: cluster.Worker}).ClientTLS()
	c.ServerName = "ps-1.elsewhere"
	err := check(t, addr, credentials.NewTLS(c))
	if !IsTLSError(err) || !strings.Contains(err.Error(), "ps-1.elsewhere") {
		t.Errorf("wrong server name: %v", err)
	}
}

func TestLoadRejectsMismatchedFiles(t *testing.T) {
	dir, other := makeDir(t), makeDir(t)
	ps := cluster.Task{Type: cluster.PS}
	f := InDir(dir, ps)
	f.CA = filepath.Join(other, certs.CAFile)
	if _, err := Load(f); err == nil || !strings.Contains(err.Error(), "not valid under the CA") {
		t.Errorf("certificate from another CA: %v", err)
	}
	f = InDir(dir, ps)
	f.Key = InDir(dir, cluster.Task{Type: cluster.Worker}).Key
	if _, err := Load(f); err == nil || !strings.Contains(err.Error(), "loading") {
		t.Errorf("key of another task: %v", err)
	}
	f = InDir(dir, ps)
	f.CA = f.Key
	if _, err := Load(f); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("key as CA: %v", err)
	}
	if _, err := Load(InDir(t.TempDir(), ps)); err == nil {
		t.Error("empty directory accepted")
	}
	if c := load(t, dir, ps); c.Name() != "ps-0" || c.ServerTLS().ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("name %q, client auth %v", c.Name(), c.ServerTLS().ClientAuth)
	}
}

func TestResolve(t *testing.T) {
	w1 := cluster.Task{Type: cluster.Worker, Index: 1}
	if _, ok, err := Resolve("", Files{}, w1); ok || err != nil {
		t.Errorf("no flags: ok %v err %v", ok, err)
	}
	f, ok, err := Resolve("/d", Files{Key: "/k.pem"}, w1)
	if !ok || err != nil || f != (Files{Cert: "/d/worker-1.pem", Key: "/k.pem", CA: "/d/ca.pem"}) {
		t.Errorf("dir + key: %+v %v %v", f, ok, err)
	}
	if _, _, err := Resolve("", Files{Cert: "c", Key: "k"}, w1); err == nil || !strings.Contains(err.Error(), "--tls-ca") {
		t.Errorf("missing CA: %v", err)
	}
}

func TestCheckPlaintext(t *testing.T) {
	if w, err := CheckPlaintext(loopSpec, false); w != "" || err != nil {
		t.Errorf("loopback: %q %v", w, err)
	}
	open := cluster.Spec{Chief: []string{"localhost:1"}, PS: []string{"[::1]:2"}, Worker: []string{"10.1.2.3:3"}}
	if _, err := CheckPlaintext(open, false); err == nil || !strings.Contains(err.Error(), "10.1.2.3:3") || !strings.Contains(err.Error(), "--insecure") {
		t.Errorf("non-loopback without --insecure: %v", err)
	}
	if w, err := CheckPlaintext(open, true); err != nil || !strings.Contains(w, "plaintext") {
		t.Errorf("--insecure: %q %v", w, err)
	}
}

func TestRefusalLogIsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	l := &limiter{log: slog.New(slog.NewTextHandler(&buf, nil)), every: 5 * time.Second, now: func() time.Time { return now }}
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 9}
	for i := 0; i < 4; i++ {
		l.refused(addr, context.DeadlineExceeded)
		now = now.Add(time.Second)
	}
	now = now.Add(5 * time.Second)
	l.refused(addr, context.DeadlineExceeded)
	out := buf.String()
	if n := strings.Count(out, "TLS handshake refused"); n != 2 || !strings.Contains(out, "suppressed_since_last=3") || !strings.Contains(out, "10.0.0.1:9") {
		t.Errorf("%d lines:\n%s", n, out)
	}
}

// TestPlaintextClientLearnsTheServerNeedsTLS: a plaintext call to a
// mutual-TLS server fails in a way IsPlaintextToTLS recognises, and the
// probe says the port speaks TLS; a plaintext server's port does not,
// nor does a closed one.
func TestPlaintextClientLearnsTheServerNeedsTLS(t *testing.T) {
	dir := makeDir(t)
	addr := serve(t, load(t, dir, cluster.Task{Type: "chief"}), slog.New(slog.DiscardHandler))
	err := check(t, addr, insecure.NewCredentials())
	if !IsPlaintextToTLS(err) {
		t.Fatalf("plaintext call to a TLS server: %v; IsPlaintextToTLS says no", err)
	}
	ctx := context.Background()
	if !SpeaksTLS(ctx, addr, 5*time.Second) {
		t.Fatal("the TLS server's port does not speak TLS, says the probe")
	}
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	healthpb.RegisterHealthServer(g, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(plain) }()
	defer func() { g.Stop(); <-done }()
	if SpeaksTLS(ctx, plain.Addr().String(), 5*time.Second) {
		t.Fatal("a plaintext gRPC server speaks TLS, says the probe")
	}
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	if SpeaksTLS(ctx, closedAddr, 5*time.Second) {
		t.Fatal("a closed port speaks TLS, says the probe")
	}
}
