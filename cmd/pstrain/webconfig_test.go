package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	// Epochs enough for the run to outlast the launcher's first scrapes
	// (it samples at start, then each second) by a few seconds: two epochs
	// ended at ~1.1 s, a race with the second sample.
	run := startTask(t, nil, "run", "--ps", "1", "--workers", "1", "--data-dir", d, "--data-fraction", "0.1", "--epochs", "6",
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

// TestPrometheusScrapesUnderWebConfig runs scripts/prometheus/prometheus.yml
// with its commented web config block in force (scheme https, tls_config,
// basic_auth; only the paths changed to this test's files) in a real
// Prometheus against a cluster under a web config with TLS and a user:
// every task's target must be up, so the example is one that works.
func TestPrometheusScrapesUnderWebConfig(t *testing.T) {
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		testbin.NeedOrSkip(t, "prometheus is not on PATH (apt-get install prometheus)")
	}
	d, tmp := testbin.MNIST(t), t.TempDir()
	webDir := t.TempDir()
	web := testcert.WebConfig(t, webDir, "prometheus", "s3cret", true)
	pw := filepath.Join(tmp, "password")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sd := filepath.Join(tmp, "targets")
	cfg := filepath.Join(tmp, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(webScrapeConfig(t, sd, filepath.Join(webDir, "cert.pem"), pw)), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	promAddr := l.Addr().String()
	l.Close()
	prom := startCommand(t, promBin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(tmp, "tsdb"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	run := startTask(t, nil, "run", "--ps", "1", "--workers", "1", "--data-dir", d, "--data-fraction", "0.1", "--epochs", "50",
		"--target-accuracy", "0", "--run-dir", filepath.Join(tmp, "run"), "--sd-dir", sd, "--web.config.file", web)
	query := "http://" + promAddr + "/api/v1/query?query=" + url.QueryEscape(`count(up{job="pstrain"} == 1)`)
	deadline := time.Now().Add(90 * time.Second)
	for last := ""; ; {
		if n := promValue(query); n == "3" {
			break
		} else if n != last {
			last = n
			t.Logf("targets up: %q", n)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus never scraped the 3 tasks; its targets:\n%s\nprometheus:\n%s\nrun:\n%s",
				promGet("http://"+promAddr+"/api/v1/targets"), prom.out.String(), tail(run.out.String(), 20))
		}
		select {
		case err := <-run.done:
			t.Fatalf("the run ended before Prometheus scraped it: %v\n%s", err, tail(run.out.String(), 20))
		case <-time.After(500 * time.Millisecond):
		}
	}
	run.cmd.Process.Signal(os.Interrupt)
	run.wait(t, time.Minute)
}

// webScrapeConfig is scripts/prometheus/prometheus.yml with its
// commented HTTPS and basic-auth lines uncommented, their files replaced
// by certFile and passwordFile, and the targets read from sdDir.
func webScrapeConfig(t *testing.T, sdDir, certFile, passwordFile string) string {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "scripts", "prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	uncommented := 0
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case line == "    scheme: http":
			continue // the example's scheme replaces it
		case strings.HasPrefix(line, "    #   ") && !strings.HasPrefix(strings.TrimSpace(line[len("    #   "):]), "#"):
			line = "    " + line[len("    #   "):]
			uncommented++
		case strings.HasSuffix(line, "# __SD_DIR__"):
			line = "          - " + filepath.Join(sdDir, "*.json")
		}
		out = append(out, line)
	}
	if uncommented < 6 {
		t.Fatalf("prometheus.yml: %d commented web config lines, want the scheme, tls_config and basic_auth", uncommented)
	}
	text := strings.Join(out, "\n")
	text = strings.ReplaceAll(text, "/etc/pstrain/metrics/cert.pem", certFile)
	return strings.ReplaceAll(text, "/etc/pstrain/metrics/password", passwordFile)
}

// startCommand starts name with its output captured; it is killed when
// the test ends.
func startCommand(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(name, args...)
	buf := &lockedBuf{seen: make(chan struct{}, 1)}
	cmd.Stdout, cmd.Stderr = buf, buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, out: buf, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

// promValue is the value of a one-sample instant query, "" if none.
func promValue(queryURL string) string {
	var r struct {
		Data struct {
			Result []struct {
				Value []any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if json.Unmarshal([]byte(promGet(queryURL)), &r) != nil || len(r.Data.Result) != 1 || len(r.Data.Result[0].Value) != 2 {
		return ""
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	return s
}

func promGet(u string) string {
	resp, err := http.Get(u)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return string(b)
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
