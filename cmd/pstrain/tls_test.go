package main

// Mutual TLS end to end: a whole local cluster over mTLS, a task with
// certificates from another CA giving up with a clear message, and the
// certs command itself.

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/transport/certs"
	"github.com/pstrain/pstrain/transport/tlsconf"
)

func TestRunOverMutualTLS(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tlsDir, rp := filepath.Join(tmp, "tls"), filepath.Join(tmp, "r.json")
	out, err := pstrain(t, ctx, "run", "--tls-dir", tlsDir, "--data-dir", d, "--data-fraction", "0.1", "--epochs", "1",
		"--target-accuracy", "0.8", "--eval-every", "500ms", "--run-dir", filepath.Join(tmp, "run"), "--sd-dir", "", "--report", rp)
	if err != nil {
		t.Fatalf("pstrain run --tls-dir: %v\n%s", err, out)
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	if rep.TestAccuracy < 0.8 || rep.GlobalSteps == 0 {
		t.Errorf("accuracy %.4f after %d steps, want >= 0.8", rep.TestAccuracy, rep.GlobalSteps)
	}
	// Every task ran with its own certificate, made by run.
	for _, name := range []string{"chief-0", "ps-0", "ps-1", "worker-0", "worker-1"} {
		st, err := os.Stat(filepath.Join(tlsDir, name+"-key.pem"))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s key: %v %v", name, err, st)
		}
		log := strings.Replace(name, "chief-0", "chief", 1) + ".log"
		b, err := os.ReadFile(filepath.Join(tmp, "run", "logs", log))
		if err != nil || !strings.Contains(string(b), "mutual TLS") || !strings.Contains(string(b), "name="+name) {
			t.Errorf("%s: no mutual TLS in its log (%v):\n%s", name, err, b)
		}
	}
}

func TestWrongCAGivesUpWithinConnectTimeout(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	addrs := freeAddrs(t, 3)
	spec := cluster.Spec{Chief: addrs[:1], PS: addrs[1:2], Worker: addrs[2:]}
	cf := filepath.Join(tmp, "cluster.json")
	if err := os.WriteFile(cf, spec.JSON(), 0o644); err != nil {
		t.Fatal(err)
	}
	good, foreign := filepath.Join(tmp, "good"), filepath.Join(tmp, "foreign")
	for _, dir := range []string{good, foreign} {
		if _, err := certs.Generate(dir, spec, nil, certs.Options{}, false); err != nil {
			t.Fatal(err)
		}
	}
	common := []string{"--cluster", cf, "--ps", "1", "--workers", "1", "--data-dir", d, "--metrics-addr", "off", "--auth-token-file", tokenFile(t)}
	chief := startTask(t, nil, append([]string{"chief", "--tls-dir", good, "--connect-timeout", "1m"}, common...)...)
	chief.waitOutput(t, "chief listening", 30*time.Second)

	const timeout = 3 * time.Second
	start := time.Now()
	worker := startTask(t, nil, append([]string{"worker", "--index", "0", "--tls-dir", foreign, "--connect-timeout", timeout.String()}, common...)...)
	err := worker.wait(t, timeout+30*time.Second) // data loading comes first
	took := time.Since(start)
	out := worker.out.String()
	if err == nil {
		t.Fatalf("worker with another cluster's certificates succeeded:\n%s", out)
	}
	for _, want := range []string{"chief at " + addrs[0], "TLS failure", "certificate signed by unknown authority"} {
		if !strings.Contains(out, want) {
			t.Errorf("worker output lacks %q:\n%s", want, out)
		}
	}
	if took < timeout {
		t.Errorf("gave up after %v, before --connect-timeout %v", took, timeout)
	}
	// The chief saw the refused handshakes too, and keeps running.
	chief.waitOutput(t, "TLS handshake refused", 10*time.Second)
	select {
	case err := <-chief.done:
		t.Fatalf("chief exited: %v\n%s", err, chief.out.String())
	default:
	}
}

func TestPlaintextOnNonLoopbackNeedsInsecure(t *testing.T) {
	cf := filepath.Join(t.TempDir(), "cluster.json")
	spec := cluster.Spec{Chief: []string{"10.255.0.1:2222"}, PS: []string{"10.255.0.2:2222"}, Worker: []string{"10.255.0.3:2222"}}
	if err := os.WriteFile(cf, spec.JSON(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := pstrain(t, context.Background(), "ps", "--cluster", cf, "--index", "0", "--ps", "1", "--workers", "1")
	if err == nil || !strings.Contains(out, "not loopback") || !strings.Contains(out, "--insecure") {
		t.Errorf("plaintext ps on 10.255.0.2: err %v, output:\n%s", err, out)
	}
	out, err = pstrain(t, context.Background(), "ps", "--cluster", cf, "--index", "0", "--ps", "1", "--workers", "1", "--tls-cert", "x.pem")
	if err == nil || !strings.Contains(out, "--tls-key, --tls-ca missing") {
		t.Errorf("half the TLS flags: err %v, output:\n%s", err, out)
	}
}

func TestCertsCommand(t *testing.T) {
	tmp := t.TempDir()
	cf, out := filepath.Join(tmp, "cluster.json"), filepath.Join(tmp, "tls")
	spec := cluster.Spec{Chief: []string{"chief.example:2222"}, PS: []string{"10.0.0.2:2222"}, Worker: []string{"w0:1", "w1:1"}}
	if err := os.WriteFile(cf, spec.JSON(), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	ctx := context.Background()
	if err := cmdCerts(ctx, []string{"--cluster", cf, "--out", out, "--hosts", "lb.example"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "chief-0.pem", "chief-0-key.pem", "ps-0.pem", "worker-1.pem", "worker-1-key.pem"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if !strings.Contains(stdout.String(), "chief.example, localhost, 127.0.0.1, ::1, lb.example") {
		t.Errorf("output does not list the chief's names:\n%s", stdout.String())
	}
	if err := cmdCerts(ctx, []string{"--cluster", cf, "--out", out}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second run without --force: %v", err)
	}
	if err := cmdCerts(ctx, []string{"--cluster", cf, "--out", out, "--force"}, &stdout, &stderr); err != nil {
		t.Errorf("--force: %v", err)
	}
	if err := cmdCerts(ctx, []string{"--cluster", cf}, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "--out") {
		t.Errorf("no --out: %v", err)
	}
}

// TestWorkerWithoutCertificateFailsFast: a worker started without TLS
// flags against a mutual-TLS chief says at once that the cluster
// requires mutual TLS and which flags to pass, instead of waiting out
// --connect-timeout on "error reading server preface".
func TestWorkerWithoutCertificateFailsFast(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	addrs := freeAddrs(t, 3)
	spec := cluster.Spec{Chief: addrs[:1], PS: addrs[1:2], Worker: addrs[2:]}
	cf := filepath.Join(tmp, "cluster.json")
	if err := os.WriteFile(cf, spec.JSON(), 0o644); err != nil {
		t.Fatal(err)
	}
	tlsDir := filepath.Join(tmp, "tls")
	if _, err := certs.Generate(tlsDir, spec, nil, certs.Options{}, false); err != nil {
		t.Fatal(err)
	}
	common := []string{"--cluster", cf, "--ps", "1", "--workers", "1", "--data-dir", d, "--metrics-addr", "off",
		"--auth-token-file", tokenFile(t), "--connect-timeout", "1m"}
	chief := startTask(t, nil, append([]string{"chief", "--tls-dir", tlsDir}, common...)...)
	chief.waitOutput(t, "chief listening", 30*time.Second)

	start := time.Now()
	worker := startTask(t, nil, append([]string{"worker", "--index", "0"}, common...)...)
	err := worker.wait(t, time.Minute)
	took := time.Since(start)
	out := worker.out.String()
	t.Logf("output:\n%s", out)
	if err == nil {
		t.Fatalf("a worker without a certificate joined a mutual-TLS cluster:\n%s", out)
	}
	for _, want := range []string{"requires mutual TLS", "--tls-dir"} {
		if !strings.Contains(out, want) {
			t.Errorf("worker output lacks %q:\n%s", want, out)
		}
	}
	// From the process's start, loading its data included (about a
	// second): far below --connect-timeout.
	if took > 10*time.Second {
		t.Errorf("the worker took %v to give up (--connect-timeout 1m), want <= 10s", took)
	}
}

// `pstrain run --tls-dir --ps-replicas 1` makes a certificate for every
// standby too, named as its identity (standby-N: transport/auth binds a
// session's role to its certificate's name), and for every slot a scale
// request may start (--max-ps 3: ps/2 and standby/2).
func TestRunTLSArgsCertifiesStandbys(t *testing.T) {
	dir := t.TempDir()
	r := config.Default()
	r.PSReplicas, r.MaxPS = 1, 3
	if _, err := runTLSArgs(dir, r, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"standby-0", "standby-1", "standby-2", "ps-2"} {
		f, err := tlsconf.Load(tlsconf.Files{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem"), CA: filepath.Join(dir, certs.CAFile)})
		if err == nil && f.Name() != name {
			t.Fatalf("%s's certificate is named %q", name, f.Name())
		}
		if err != nil {
			t.Fatalf("%s's certificate: %v", name, err)
		}
	}
}
