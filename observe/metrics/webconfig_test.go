package metrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/internal/testcert"
)

// webClient trusts the certificate in certFile ("" = plain HTTP).
func webClient(t *testing.T, certFile string) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	if certFile != "" {
		pem, err := os.ReadFile(certFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			t.Fatal("no certificate in", certFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// status GETs url with client, with basic auth when user is not "".
func status(t *testing.T, client *http.Client, url, user, password string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestWebConfigGuardsBothPaths serves /metrics and /healthz under a web
// config file with basic auth, without and with TLS: no credentials or a
// wrong password is 401, the right ones 200 with the exposition; under
// TLS the URL is https and a plain HTTP request gets no metrics.
func TestWebConfigGuardsBothPaths(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		name := map[bool]string{false: "basic-auth", true: "tls+basic-auth"}[tlsOn]
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			file := testcert.WebConfig(t, dir, "prometheus", "s3cret", tlsOn)
			reg := prometheus.NewRegistry()
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "pstrain_test_total", Help: "test"})
			reg.MustRegister(c)
			c.Add(3)
			s := NewServer(reg, nil, nil)
			if err := s.StartWebConfig(context.Background(), "127.0.0.1:0", file); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			certFile := ""
			if tlsOn {
				certFile = dir + "/cert.pem"
				if !strings.HasPrefix(s.URL(), "https://") {
					t.Fatalf("URL %s under TLS", s.URL())
				}
			}
			client := webClient(t, certFile)
			for _, path := range []string{MetricsPath, HealthPath} {
				url := s.URL() + path
				if code, _ := status(t, client, url, "", ""); code != http.StatusUnauthorized {
					t.Errorf("%s without credentials: %d, want 401", path, code)
				}
				if code, _ := status(t, client, url, "prometheus", "wrong"); code != http.StatusUnauthorized {
					t.Errorf("%s with a wrong password: %d, want 401", path, code)
				}
				code, body := status(t, client, url, "prometheus", "s3cret")
				if code != http.StatusOK {
					t.Errorf("%s with credentials: %d, want 200", path, code)
				}
				if path == MetricsPath && !strings.Contains(body, "pstrain_test_total 3") {
					t.Errorf("%s: no metric in\n%s", path, body)
				}
			}
			if tlsOn {
				plain := "http://" + s.Addr() + MetricsPath
				if code, body := status(t, webClient(t, ""), plain, "prometheus", "s3cret"); code == http.StatusOK || strings.Contains(body, "pstrain_test_total") {
					t.Errorf("plain HTTP to the TLS endpoint: %d %q", code, body)
				}
			}
		})
	}
}

// TestWebConfigInvalidIsRefusedAtStart: a typo in the file (the toolkit
// decodes strictly) or a password that is not a bcrypt hash fails Start,
// instead of a server that refuses every scrape.
func TestWebConfigInvalidIsRefusedAtStart(t *testing.T) {
	for name, text := range map[string]string{
		"unknown key":   "basic_auth_user:\n  a: b\n",
		"not a hash":    "basic_auth_users:\n  prometheus: plaintext\n",
		"missing files": "tls_server_config:\n  cert_file: nothere.pem\n  key_file: nothere.key\n",
	} {
		t.Run(name, func(t *testing.T) {
			file := t.TempDir() + "/web.yml"
			if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			s := NewServer(prometheus.NewRegistry(), nil, nil)
			defer s.Close()
			if err := s.StartWebConfig(context.Background(), "127.0.0.1:0", file); err == nil {
				t.Fatalf("started with %q", text)
			}
		})
	}
}
