package webconfig_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/internal/testcert"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/webconfig"
)

// serve starts a metrics server under the web config file and returns
// its address.
func serve(t *testing.T, file string) string {
	t.Helper()
	s := metrics.NewServer(prometheus.NewRegistry(), nil, nil)
	if err := s.StartWebConfig(context.Background(), "127.0.0.1:0", file); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s.Addr()
}

func code(t *testing.T, hc *http.Client, url string) int {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestLauncherReachesItsTasks: the launcher's copy of a user's web config
// (users, TLS with relative file names) lets the launcher's client in
// with 200 on /healthz and /metrics, while the same server still answers
// 401 to a request without credentials, and the user's own account still
// works. The copy is written with mode 0600 and names files absolutely.
func TestLauncherReachesItsTasks(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(map[bool]string{false: "basic-auth", true: "tls"}[tlsOn], func(t *testing.T) {
			src := testcert.WebConfig(t, t.TempDir(), "prometheus", "s3cret", tlsOn)
			out := t.TempDir()
			derived, client, err := webconfig.ForLauncher(src, out, rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(derived); err != nil || fi.Mode().Perm() != 0o600 {
				t.Fatalf("copy %s: %v %v", derived, fi.Mode(), err)
			}
			text, _ := os.ReadFile(derived)
			if tlsOn && !strings.Contains(string(text), "cert_file: "+filepath.Dir(src)) {
				t.Errorf("copy keeps a relative cert_file:\n%s", text)
			}
			addr := serve(t, derived)
			hc := client.HTTP(5 * time.Second)
			defer hc.CloseIdleConnections()
			for _, path := range []string{metrics.HealthPath, metrics.MetricsPath} {
				if c := code(t, hc, client.URL(addr, path)); c != http.StatusOK {
					t.Errorf("launcher's client %s: %d", path, c)
				}
			}
			anon := (*webconfig.Client)(nil).HTTP(5 * time.Second)
			if tlsOn {
				// Credentials alone, without TLS, get no metrics.
				if resp, err := anon.Get("http://" + addr + metrics.MetricsPath); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						t.Error("plain HTTP answered 200 under TLS")
					}
				}
				return
			}
			if c := code(t, anon, "http://"+addr+metrics.MetricsPath); c != http.StatusUnauthorized {
				t.Errorf("no credentials: %d, want 401", c)
			}
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+metrics.MetricsPath, nil)
			req.SetBasicAuth("prometheus", "s3cret")
			resp, err := anon.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("the user's account in the copy: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
		})
	}
}

// TestLauncherPinsTheCertificate: the launcher's client refuses a server
// presenting another certificate than the web config file's, though
// both are valid for 127.0.0.1.
func TestLauncherPinsTheCertificate(t *testing.T) {
	src := testcert.WebConfig(t, t.TempDir(), "prometheus", "s3cret", true)
	_, client, err := webconfig.ForLauncher(src, t.TempDir(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other := testcert.WebConfig(t, t.TempDir(), "prometheus", "s3cret", true) // a new key pair
	addr := serve(t, other)
	hc := client.HTTP(5 * time.Second)
	defer hc.CloseIdleConnections()
	if resp, err := hc.Get(client.URL(addr, metrics.HealthPath)); err == nil {
		resp.Body.Close()
		t.Fatalf("another certificate accepted: %s", resp.Status)
	} else if !strings.Contains(err.Error(), "not the one of the web config file") {
		t.Fatalf("refused for another reason: %v", err)
	}
}

// TestForLauncherRefuses files the launcher cannot work with.
func TestForLauncherRefuses(t *testing.T) {
	dir := t.TempDir()
	testcert.SelfSigned(t, dir)
	for name, text := range map[string]string{
		"client certificates": "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: cert.pem\n",
		"the launcher's user": "basic_auth_users:\n  pstrain-launcher: $2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi\n",
		"a typo":              "tls_server_config:\n  certfile: cert.pem\n",
	} {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yml")
			if err := os.WriteFile(src, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, _, err := webconfig.ForLauncher(src, t.TempDir(), rand.Reader); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// TestNoUsersNoCredentials: a TLS-only file gets no launcher user, and a
// short random source is an error rather than a guessable password.
func TestNoUsersNoCredentials(t *testing.T) {
	dir := t.TempDir()
	testcert.SelfSigned(t, dir)
	src := filepath.Join(dir, "tls.yml")
	if err := os.WriteFile(src, []byte("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	derived, client, err := webconfig.ForLauncher(src, t.TempDir(), bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	if text, _ := os.ReadFile(derived); strings.Contains(string(text), webconfig.LauncherUser) {
		t.Errorf("launcher user added to a file without users:\n%s", text)
	}
	addr := serve(t, derived)
	hc := client.HTTP(5 * time.Second)
	defer hc.CloseIdleConnections()
	if c := code(t, hc, client.URL(addr, metrics.HealthPath)); c != http.StatusOK {
		t.Errorf("TLS only: %d", c)
	}
	users := testcert.WebConfig(t, t.TempDir(), "prometheus", "s3cret", false)
	if _, _, err := webconfig.ForLauncher(users, t.TempDir(), bytes.NewReader([]byte{1, 2})); err == nil {
		t.Error("a password from 2 random bytes accepted")
	}
}
