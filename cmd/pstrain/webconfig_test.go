package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/internal/testcert"
	"github.com/pstrain/pstrain/observe/report"
)

// TestRunUnderWebConfig runs a local cluster whose metrics endpoints
// serve under a web config with TLS and basic auth: a scrape of a live
// task without credentials is 401, with them 200; and the launcher's
// own scrapes of its tasks (the report's bottleneck) still work, with no
// task restarted by the liveness check.
func TestRunUnderWebConfig(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	web := testcert.WebConfig(t, t.TempDir(), "prometheus", "s3cret", true)
	sd, rep := filepath.Join(tmp, "targets"), filepath.Join(tmp, "r.json")
	run := startTask(t, nil, "run", "--ps", "1", "--workers", "1", "--data-dir", d, "--data-fraction", "0.1", "--epochs", "2",
		"--target-accuracy", "0", "--run-dir", filepath.Join(tmp, "run"), "--sd-dir", sd, "--report", rep,
		"--web.config.file", web, "--task-timeout", "2s")
	client := trusting(t, filepath.Join(filepath.Dir(web), "cert.pem"))
	url := "https://" + chiefTarget(t, sd, run) + "/metrics"
	if code := statusOf(t, run, client, url, ""); code != http.StatusUnauthorized {
		t.Errorf("scrape without credentials: %d, want 401", code)
	}
	if code := statusOf(t, run, client, url, "s3cret"); code != http.StatusOK {
		t.Errorf("scrape with credentials: %d, want 200", code)
	}
	if err := run.wait(t, 3*time.Minute); err != nil {
		t.Fatalf("run: %v\n%s", err, run.out.String())
	}
	r, err := report.Read(rep)
	if err != nil {
		t.Fatal(err)
	}
	// The chief and the PS live to the end of the run: the launcher's
	// last scrape of each must have succeeded.
	if r.Bottleneck == nil {
		t.Fatal("no bottleneck in the report")
	}
	up := map[string]bool{}
	for _, tk := range r.Bottleneck.Tasks {
		up[tk.Task] = tk.Up && tk.RSSBytes != nil
		if !up[tk.Task] {
			t.Logf("%s: not scraped: %s", tk.Task, tk.Error)
		}
	}
	if !up["chief"] || !up["ps/0"] {
		t.Errorf("the launcher could not scrape its tasks under the web config: %+v", r.Bottleneck.Tasks)
	}
	if len(r.Restarts) > 0 {
		t.Errorf("tasks restarted under the web config: %+v", r.Restarts)
	}
}

// trusting is an HTTPS client trusting the certificate in certFile.
func trusting(t *testing.T, certFile string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// chiefTarget waits for the run's file_sd targets and returns the
// chief's metrics address.
func chiefTarget(t *testing.T, sdDir string, run *proc) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var groups []struct {
			Targets []string          `json:"targets"`
			Labels  map[string]string `json:"labels"`
		}
		if b, err := os.ReadFile(filepath.Join(sdDir, "pstrain.json")); err == nil && json.Unmarshal(b, &groups) == nil {
			for _, g := range groups {
				if g.Labels["role"] == "chief" && len(g.Targets) == 1 {
					return g.Targets[0]
				}
			}
		}
		select {
		case <-run.out.seen:
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("no chief target in %s; output:\n%s", sdDir, run.out.String())
	return ""
}

// statusOf GETs url (as user prometheus with password, if not ""),
// retrying while the endpoint is not up yet.
func statusOf(t *testing.T, run *proc, client *http.Client, url, password string) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if password != "" {
			req.SetBasicAuth("prometheus", password)
		}
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v; output:\n%s", url, err, run.out.String())
		}
		time.Sleep(50 * time.Millisecond) // the chief's endpoint is not listening yet
	}
}
