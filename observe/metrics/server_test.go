package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/internal/syncbuf"
)

// startServer starts a Server on a free loopback port and closes it when the
// test ends.
func startServer(t *testing.T, g prometheus.Gatherer, health func() error) *Server {
	t.Helper()
	s := NewServer(g, health, nil)
	if err := s.Start(context.Background(), "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, body := do(t, req)
	return resp.StatusCode, body
}

// do sends req and reads the whole response.
func do(t *testing.T, req *http.Request) (*http.Response, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// waitDone fails the test if s has not stopped within a generous bound; it
// does not sleep, it waits for the server's Done channel.
func waitDone(t *testing.T, s *Server) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("server goroutine did not exit")
	}
}

func TestServeAndScrape(t *testing.T) {
	reg := NewRegistry("v0.0.1-test")
	w := NewWorker(reg)
	w.Steps.Add(7)
	w.Samples.Add(7 * 32)
	w.TrainLoss.Set(0.25)
	w.RPCSentBytes.WithLabelValues("push").Add(1000)
	w.RPCSentBytes.WithLabelValues("pull").Add(24)
	w.ObservePhase(PhasePull, 150*time.Microsecond)
	w.ObservePhase(PhasePull, 350*time.Microsecond)
	w.ObservePhase(PhasePush, 2*time.Millisecond)

	s := startServer(t, reg, nil)
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || strings.HasSuffix(s.Addr(), ":0") {
		t.Fatalf("Addr() = %q, want the actual loopback port", s.Addr())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fams, err := Scrape(ctx, s.URL()+MetricsPath)
	if err != nil {
		t.Fatal(err)
	}

	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{MetricWorkerSteps, nil, 7},
		{MetricWorkerSamples, nil, 224},
		{MetricTrainLoss, nil, 0.25},
		{MetricRPCSentBytes, map[string]string{LabelOp: "push"}, 1000},
		{MetricBuildInfo, map[string]string{LabelVersion: "v0.0.1-test"}, 1},
	}
	for _, c := range checks {
		if got, ok := fams.Value(c.name, c.labels); !ok || got != c.want {
			t.Errorf("Value(%s, %v) = %v, %v; want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if got := fams.Sum(MetricRPCSentBytes, nil); got != 1024 {
		t.Errorf("Sum(%s) = %v, want 1024", MetricRPCSentBytes, got)
	}
	if _, ok := fams.Value(MetricRPCSentBytes, nil); ok {
		t.Errorf("Value(%s, nil) succeeded although two series match", MetricRPCSentBytes)
	}

	pull, ok := fams.Histogram(MetricWorkerStepPhase, map[string]string{LabelPhase: PhasePull})
	if !ok || pull.Count != 2 || pull.Sum < 0.000499 || pull.Sum > 0.000501 {
		t.Errorf("pull phase = %+v, %v; want 2 observations summing to 500µs", pull, ok)
	}
	all, ok := fams.Histogram(MetricWorkerStepPhase, nil)
	if !ok || all.Count != 3 {
		t.Errorf("all phases = %+v, %v; want 3 observations", all, ok)
	}
	if len(all.Buckets) != len(LatencyBuckets()) {
		t.Errorf("merged histogram has %d buckets, want %d", len(all.Buckets), len(LatencyBuckets()))
	}
}

func TestHealthz(t *testing.T) {
	var (
		mu        sync.Mutex
		healthErr error
	)
	s := startServer(t, prometheus.NewRegistry(), func() error {
		mu.Lock()
		defer mu.Unlock()
		return healthErr
	})

	if code, body := get(t, s.URL()+HealthPath); code != http.StatusOK || body != "ok\n" {
		t.Errorf("healthy: %d %q, want 200 \"ok\\n\"", code, body)
	}
	mu.Lock()
	healthErr = errors.New("ps/1 unreachable")
	mu.Unlock()
	if code, body := get(t, s.URL()+HealthPath); code != http.StatusServiceUnavailable || body != "ps/1 unreachable\n" {
		t.Errorf("unhealthy: %d %q, want 503 with the error text", code, body)
	}
}

func TestNilHealthIsHealthy(t *testing.T) {
	s := startServer(t, prometheus.NewRegistry(), nil)
	if code, body := get(t, s.URL()+HealthPath); code != http.StatusOK || body != "ok\n" {
		t.Errorf("%d %q, want 200 \"ok\\n\"", code, body)
	}
}

func TestOnlyMetricsAndHealthAreServed(t *testing.T) {
	s := startServer(t, prometheus.NewRegistry(), nil)
	for _, path := range []string{"/", "/debug/pprof/", "/debug/pprof/heap", "/debug/vars", "/metricsx"} {
		if code, _ := get(t, s.URL()+path); code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, code)
		}
	}
	resp, err := http.Post(s.URL()+MetricsPath, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST %s = %d, want 405", MetricsPath, resp.StatusCode)
	}
}

func TestCollectorErrorDoesNotFailScrape(t *testing.T) {
	// Host metrics from an empty proc dir fail; the rest is still served.
	host, err := NewHostCollector(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(host)
	NewChief(reg).LiveWorkers.Set(4)

	var logs syncbuf.Buffer
	s := NewServer(reg, nil, slog.New(slog.NewTextHandler(&logs, nil)))
	if err := s.Start(context.Background(), "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fams, err := Scrape(context.Background(), s.URL()+MetricsPath)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := fams.Value(MetricLiveWorkers, nil); !ok || v != 4 {
		t.Errorf("%s = %v, %v; want 4", MetricLiveWorkers, v, ok)
	}
	if !strings.Contains(logs.String(), "reading stat") {
		t.Errorf("collector error not logged; log: %q", logs.String())
	}
}

func TestStartPortInUse(t *testing.T) {
	first := startServer(t, prometheus.NewRegistry(), nil)
	second := NewServer(prometheus.NewRegistry(), nil, nil)
	err := second.Start(context.Background(), first.Addr())
	if err == nil {
		second.Close()
		t.Fatalf("second Start on %s succeeded", first.Addr())
	}
	if !strings.Contains(err.Error(), first.Addr()) {
		t.Errorf("error %q does not name the address %s", err, first.Addr())
	}
	if err := second.Close(); err != nil {
		t.Errorf("Close after failed Start: %v", err)
	}
	waitDone(t, second)
}

func TestStartTwice(t *testing.T) {
	s := startServer(t, prometheus.NewRegistry(), nil)
	if err := s.Start(context.Background(), "127.0.0.1:0"); err == nil {
		t.Fatal("second Start succeeded")
	}
}

func TestContextCancelStopsServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := NewServer(prometheus.NewRegistry(), nil, nil)
	if err := s.Start(ctx, "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	url := s.URL() + HealthPath
	if code, _ := get(t, url); code != http.StatusOK {
		t.Fatalf("GET %s = %d before cancel", url, code)
	}
	cancel()
	waitDone(t, s)
	if _, err := http.Get(url); err == nil {
		t.Errorf("GET %s succeeded after the context was cancelled", url)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close after cancel: %v", err)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	s := NewServer(prometheus.NewRegistry(), nil, nil)
	if err := s.Start(context.Background(), "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	waitDone(t, s)
	if err := s.Start(context.Background(), "127.0.0.1:0"); err == nil {
		t.Error("Start after Close succeeded")
	}
}

func TestCloseBeforeStart(t *testing.T) {
	s := NewServer(prometheus.NewRegistry(), nil, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, s)
	if err := s.Start(context.Background(), "127.0.0.1:0"); err == nil {
		s.Close()
		t.Fatal("Start after Close succeeded")
	}
	if s.Addr() != "" || s.URL() != "" {
		t.Errorf("Addr/URL = %q/%q on a server never started", s.Addr(), s.URL())
	}
}

func TestScrapeErrors(t *testing.T) {
	s := startServer(t, prometheus.NewRegistry(), func() error { return errors.New("down") })
	ctx := context.Background()
	if _, err := Scrape(ctx, s.URL()+"/nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Scrape of a 404 page: err = %v, want one with the status", err)
	}
	if _, err := Scrape(ctx, s.URL()+HealthPath); err == nil || !strings.Contains(err.Error(), "down") {
		t.Errorf("Scrape of a 503 page: err = %v, want one quoting the body", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Scrape(cctx, s.URL()+MetricsPath); !errors.Is(err, context.Canceled) {
		t.Errorf("Scrape with a cancelled context: err = %v, want context.Canceled", err)
	}
}

// A scraper offering gzip still gets plain text: compression would cost the
// process a ~1 MB compressor per scrape (see Server).
func TestScrapesAreNotCompressed(t *testing.T) {
	s := startServer(t, NewRegistry("v0.0.1-test"), nil)
	req, err := http.NewRequest("GET", s.URL()+MetricsPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip")
	resp, body := do(t, req)
	if enc := resp.Header.Get("Content-Encoding"); enc != "" || !strings.Contains(body, MetricBuildInfo) {
		t.Fatalf("Content-Encoding %q, body starts %q; want plain text with %s", enc, body[:min(len(body), 40)], MetricBuildInfo)
	}
}
