package launcher

import (
	"context"
	"crypto/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/internal/testcert"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/webconfig"
)

// TestWatchLivenessUnderWebConfig: a task serving /healthz under a web
// config with TLS and basic auth is probed through the launcher's client
// (its health function runs, so the probes got past TLS and the
// password), and once it stops answering it is judged unresponsive.
func TestWatchLivenessUnderWebConfig(t *testing.T) {
	src := testcert.WebConfig(t, t.TempDir(), "prometheus", "s3cret", true)
	taskFile, web, err := webconfig.ForLauncher(src, t.TempDir(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var checks atomic.Int64
	srv := metrics.NewServer(prometheus.NewRegistry(), func() error { checks.Add(1); return nil }, nil)
	if err := srv.StartWebConfig(context.Background(), "127.0.0.1:0", taskFile); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const timeout = 500 * time.Millisecond
	done := make(chan struct{})
	defer close(done)
	result := make(chan bool, 1)
	go func() {
		result <- watchLiveness(context.Background(), web, web.URL(srv.Addr(), metrics.HealthPath), timeout, done)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for checks.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatal("no probe reached the health check through TLS and basic auth")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case dead := <-result:
		if !dead {
			t.Fatal("watch ended without judging the task")
		}
	case <-time.After(timeout + 20*time.Second):
		t.Fatal("a task that stopped answering was never judged unresponsive")
	}
}
