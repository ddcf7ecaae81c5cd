package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/dataplane"
	"github.com/pstrain/pstrain/transport/tlsconf"
)

// The attacker's view of the data plane, written from docs/wire.md and
// not from the package: a request header, optionally signed.
type rawFrame struct {
	op      byte // 1 pull, 2 push
	runID   string
	worker  int32
	payload uint32 // announced payload length (the bytes are not sent)
	signAs  *auth.Identity
	keys    *auth.Keyring
}

func (f rawFrame) bytes() []byte {
	b := append([]byte("PSD3"), f.op, 0, byte(len(f.runID)))
	b = append(b, f.runID...)
	b = binary.LittleEndian.AppendUint32(b, uint32(f.worker))
	b = append(b, make([]byte, 8+8+4+8)...) // version, generation, loss, data position
	b = binary.LittleEndian.AppendUint32(b, f.payload)
	if f.signAs == nil {
		b = append(b, 255)
		return append(b, make([]byte, 4+8+16)...)
	}
	b = append(b, byte(auth.RoleCode(f.signAs.Role)))
	b = binary.LittleEndian.AppendUint32(b, uint32(f.signAs.Index))
	b = binary.LittleEndian.AppendUint64(b, f.signAs.Session)
	return append(b, f.keys.FrameMAC(*f.signAs, b)...)
}

// send writes the frame on a fresh connection and returns the answer's
// gRPC code and message; the server must then hang up.
func (f rawFrame) send(t *testing.T, addr string, tc *tls.Config) (codes.Code, string) {
	t.Helper()
	// Under TLS: the handshake, then the data plane's records.
	conn, err := dataplane.DialTCP(context.Background(), addr, tc)
	if err != nil {
		t.Fatalf("dial the data plane %s: %v", addr, err)
	}
	return f.sendOn(t, conn)
}

// sendLocal is send over the same-host Unix socket beside the data
// plane at addr (docs/wire.md, "Same host"), without the certificate
// exchange a mutual-TLS plane requires there.
func (f rawFrame) sendLocal(t *testing.T, addr string) (codes.Code, string) {
	t.Helper()
	conn, err := net.Dial("unix", "@pstrain-dataplane/"+addr)
	if err != nil {
		t.Fatalf("dial the same-host socket of %s: %v", addr, err)
	}
	return f.sendOn(t, conn)
}

// sendOn is send on conn, which it closes.
func (f rawFrame) sendOn(t *testing.T, conn net.Conn) (codes.Code, string) {
	t.Helper()
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := conn.Write(f.bytes()); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	h := make([]byte, 4+3+8+8+8+4)
	if _, err := io.ReadFull(rd, h); err != nil {
		t.Fatalf("no answer to a %d-byte frame: %v", len(f.bytes()), err)
	}
	msg := make([]byte, binary.LittleEndian.Uint32(h[31:]))
	io.ReadFull(rd, msg)
	if _, err := rd.ReadByte(); err != io.EOF {
		t.Errorf("the server kept the connection open after refusing (%v)", err)
	}
	return codes.Code(h[4]), string(msg)
}

// rejected scrapes a PS's pstrain_ps_rejected_requests_total by reason.
func rejected(t *testing.T, metricsAddr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `pstrain_ps_rejected_requests_total{reason="`)
		if !ok {
			continue
		}
		reason, val, _ := strings.Cut(rest, `"} `)
		v, _ := strconv.ParseFloat(val, 64)
		out[reason] = v
	}
	return out
}

// metricsAddrOf reads task's metrics address from the run's targets file.
func metricsAddrOf(t *testing.T, sdFile, task string) string {
	t.Helper()
	b, err := os.ReadFile(sdFile)
	if err != nil {
		t.Fatal(err)
	}
	var groups []struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	if err := json.Unmarshal(b, &groups); err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.Labels["task"] == task && len(g.Targets) > 0 {
			return g.Targets[0]
		}
	}
	t.Fatalf("no %s in %s", task, b)
	return ""
}

// TestOutsidersCannotTouchTheModel runs the outsider's attack on a
// running cluster, without and with mutual TLS: pulls and pushes on the
// raw data plane without credentials (an empty run id; gradients
// announced as worker 0), signed with a made-up token, gRPC Stop and
// Pull without credentials, a registration with another token, and an
// insider (worker/1's certificate and the run's token) posing as worker 0
// or calling Stop. Every request is refused with the right code and
// counted; the run finishes every step undisturbed.
func TestOutsidersCannotTouchTheModel(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plaintext", true: "mutual-TLS"}[withTLS], func(t *testing.T) {
			attackRun(t, withTLS)
		})
	}
}

func attackRun(t *testing.T, withTLS bool) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	runDir, sd, rp := filepath.Join(tmp, "run"), filepath.Join(tmp, "targets"), filepath.Join(tmp, "r.json")
	args := []string{"run", "--data-dir", d, "--epochs", "2", "--target-accuracy", "0", "--eval-every", "0",
		"--run-dir", runDir, "--sd-dir", sd, "--report", rp}
	tlsDir := filepath.Join(tmp, "tls")
	if withTLS {
		args = append(args, "--tls-dir", tlsDir)
	}
	run := startTask(t, nil, args...)
	run.waitOutput(t, "step ", 2*time.Minute) // training has begun

	spec, _, err := cluster.Load(filepath.Join(runDir, "cluster.json"), "")
	if err != nil {
		t.Fatal(err)
	}
	token, err := auth.ReadTokenFile(filepath.Join(runDir, auth.TokenFile))
	if err != nil {
		t.Fatal(err)
	}
	insider := auth.NewKeyring(token)
	stranger, _ := auth.NewToken(nil)
	outsider := auth.NewKeyring(stranger)

	// With TLS the attacker holds a certificate the CA signed (worker/1's):
	// the transport lets it in, the credential must not.
	var dpTLS *tls.Config
	grpcCreds := insecure.NewCredentials()
	if withTLS {
		c, err := tlsconf.Load(tlsconf.InDir(tlsDir, cluster.Task{Type: "worker", Index: 1}))
		if err != nil {
			t.Fatal(err)
		}
		dpTLS, grpcCreds = c.ClientTLS(), c.ClientCredentials()
	}

	refusals := []struct {
		name  string
		frame rawFrame
		code  codes.Code
	}{
		{"pull with an empty run id", rawFrame{op: 1, worker: -1}, codes.Unauthenticated},
		{"push as worker 0, unsigned", rawFrame{op: 2, worker: 0, payload: 1 << 20}, codes.Unauthenticated},
		{"push signed with another token", rawFrame{op: 2, worker: 0, payload: 1 << 20,
			signAs: &auth.Identity{Role: "worker", Index: 0, Session: 42}, keys: outsider}, codes.Unauthenticated},
		{"insider worker/1 pushes as worker 0", rawFrame{op: 2, worker: 0, payload: 1 << 20,
			signAs: &auth.Identity{Role: "worker", Index: 1, Session: 42}, keys: insider}, codes.PermissionDenied},
	}
	if withTLS {
		// Signed as worker/0 with the run's token, but over worker/1's
		// certificate: the certificate binds the identity.
		refusals = append(refusals, struct {
			name  string
			frame rawFrame
			code  codes.Code
		}{"worker/1's certificate claims worker/0", rawFrame{op: 2, worker: 0, payload: 1 << 20,
			signAs: &auth.Identity{Role: "worker", Index: 0, Session: 42}, keys: insider}, codes.PermissionDenied})
	}
	// Where the data plane listens: the launcher picks its ports, and
	// Status, any task's call, says.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func(who *auth.Client) *grpc.ClientConn {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(grpcCreds)}
		if who != nil {
			opts = append(opts, grpc.WithChainUnaryInterceptor(who.Unary()))
		}
		conn, err := grpc.NewClient(spec.PS[0], opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	w1 := &auth.Client{Keys: insider, Role: "worker", Index: 1}
	w1.SetSession(7)
	asW1 := pb.NewParameterServerClient(dial(w1))
	st, err := asW1.Status(ctx, &pb.StatusRequest{})
	if err != nil || st.DataAddr == "" {
		t.Fatalf("Status as worker/1: %v (data plane %q)", err, st.GetDataAddr())
	}
	dataAddr := st.DataAddr
	for _, r := range refusals {
		code, msg := r.frame.send(t, dataAddr, dpTLS)
		if code != r.code {
			t.Errorf("data plane, %s: %v %q, want %v", r.name, code, msg, r.code)
		}
		// The same frames on the same-host socket: the same refusals
		// in plaintext; under TLS, a client that has not proved it holds
		// a certificate of the cluster is refused whatever it sends.
		want := r.code
		if withTLS {
			want = codes.Unauthenticated
		}
		if runtime.GOOS == "linux" {
			if code, msg := r.frame.sendLocal(t, dataAddr); code != want {
				t.Errorf("same-host socket, %s: %v %q, want %v", r.name, code, msg, want)
			}
		}
	}
	if withTLS {
		// worker/1's certificate and key prove who it is on the
		// same-host socket as in a TLS handshake: posing as worker 0
		// there is refused as over TCP.
		dc := dataplane.NewClient(func(context.Context) (string, error) { return dataAddr, nil }, dpTLS, 8<<20)
		as0 := &auth.Client{Keys: insider, Role: "worker", Index: 0}
		as0.SetSession(42)
		dc.SignWith(as0)
		if _, err := dc.Push(ctx, &pb.PushRequest{Worker: 0, RunId: st.RunId, Grad: make([]byte, 64)}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("worker/1's certificate pushing as worker 0 through the data-plane client: %v, want PermissionDenied", err)
		}
		dc.Close()
	}

	// gRPC: no credentials, another token, an insider beyond its role.
	bare := pb.NewParameterServerClient(dial(nil))
	if _, err := bare.Stop(ctx, &pb.StopRequest{Shutdown: true}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Stop without credentials: %v", err)
	}
	if _, err := bare.Pull(ctx, &pb.PullRequest{Worker: -1}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Pull without credentials: %v", err)
	}
	if _, err := asW1.Stop(ctx, &pb.StopRequest{Shutdown: true}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("worker/1 calling Stop: %v, want PermissionDenied", err)
	}
	if _, err := asW1.Init(ctx, &pb.InitRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("worker/1 calling Init: %v, want PermissionDenied", err)
	}
	// Retaining a version would replace the model the chief scored.
	if _, err := asW1.Pull(ctx, &pb.PullRequest{Worker: 1, RunId: st.RunId, Retain: true}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("worker/1 pulling with retain: %v, want PermissionDenied", err)
	}
	conn, err := grpc.NewClient(spec.Chief[0], grpc.WithTransportCredentials(grpcCreds),
		grpc.WithChainUnaryInterceptor((&auth.Client{Keys: outsider, Role: "worker", Index: 1}).Unary()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pb.NewChiefClient(conn).Register(ctx, &pb.RegisterRequest{Role: "worker", Index: 1})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "--auth-token-file") {
		t.Errorf("registration with another token: %v", err)
	}

	// Counted by reason on the PS (the scrape is over plain HTTP).
	got := rejected(t, metricsAddrOf(t, filepath.Join(sd, "pstrain.json"), "ps/0"))
	wantAtLeast := map[string]float64{auth.ReasonNoCredential: 4, auth.ReasonBadCredential: 1, auth.ReasonForbidden: 4}
	if withTLS {
		wantAtLeast[auth.ReasonCertificate] = 1
	}
	for reason, n := range wantAtLeast {
		if got[reason] < n {
			t.Errorf("pstrain_ps_rejected_requests_total{reason=%q} = %v, want >= %v (all: %v)", reason, got[reason], n, got)
		}
	}

	if err := run.wait(t, 5*time.Minute); err != nil {
		t.Fatalf("the attacked run failed: %v\n%s", err, run.out.String())
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	// 2 epochs of 60000 samples, 2 x 128 per step: ceil(120000/256).
	if rep.GlobalSteps != 469 || len(rep.Restarts) != 0 || rep.TestAccuracy < 0.96 {
		t.Errorf("attacked run: %d steps (want 469), %d restarts, accuracy %.4f (want >= 0.96)\n%s",
			rep.GlobalSteps, len(rep.Restarts), rep.TestAccuracy, run.out.String())
	}
}
