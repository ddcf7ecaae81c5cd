package metrics

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// roleRegistries returns one registry per pstrain role, each built the way a
// real process builds it (NewRegistry plus the role's metrics), with every
// metric observed so that vectors have series to lint.
func roleRegistries() map[string]*prometheus.Registry {
	worker := NewRegistry("v0.1.0")
	w := NewWorker(worker)
	w.Steps.Inc()
	w.Samples.Add(64)
	for i, p := range Phases() {
		w.ObservePhase(p, time.Duration(i+1)*time.Millisecond)
	}
	w.TrainLoss.Set(1.75)
	w.RPCSentBytes.WithLabelValues("push").Add(4096)
	w.RPCReceivedBytes.WithLabelValues("pull").Add(4096)
	w.Retries.Inc()

	ps := NewRegistry("v0.1.0")
	p := NewPS(ps)
	p.Requests.WithLabelValues("pull").Inc()
	p.RequestDuration.WithLabelValues("pull").Observe(0.0003)
	p.GradientStaleness.Observe(2)
	p.StaleGradientsDropped.Inc()
	p.BarrierWait.Observe(0.002)
	p.GlobalStep.Set(10)
	p.ShardParameters.Set(1e6)
	p.RPCSentBytes.WithLabelValues("pull").Add(4096)
	p.RPCReceivedBytes.WithLabelValues("push").Add(4096)
	p.RejectedRequests.WithLabelValues("stale").Inc()
	p.ConnectionsClosed.WithLabelValues("data", "idle").Inc()
	p.DataPlaneConnections.Set(3)
	p.DataPlaneBuffered.Set(1 << 20)

	chief := NewRegistry("v0.1.0")
	c := NewChief(chief)
	c.GlobalStep.Set(10)
	c.EvalAccuracy.Set(0.91)
	c.EvalLoss.Set(0.3)
	c.CheckpointDuration.Observe(1.5)
	c.CheckpointSize.Set(8 << 20)
	c.CheckpointLastSuccess.SetToCurrentTime()
	c.TaskRestarts.WithLabelValues("worker/1").Inc()
	c.Recovery.Observe(2.5)
	c.StepsLost.Add(3)
	c.LiveWorkers.Set(2)

	return map[string]*prometheus.Registry{"worker": worker, "ps": ps, "chief": chief}
}

// TestPromtoolCheckMetrics runs `promtool check metrics` on the exact /metrics
// output of each role's registry and fails on any finding.
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not on PATH (apt-get install -y prometheus provides it); skipping the promtool lint of /metrics")
	}
	for role, reg := range roleRegistries() {
		t.Run(role, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, MetricsPath, nil)
			NewServer(reg, nil, nil).Handler().ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Fatalf("GET %s = %d: %s", MetricsPath, rec.Code, rec.Body)
			}
			exposition := rec.Body.String()
			if !strings.Contains(exposition, MetricBuildInfo) {
				t.Fatalf("exposition lacks %s", MetricBuildInfo)
			}

			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = strings.NewReader(exposition)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			var exit *exec.ExitError
			switch {
			case errors.As(err, &exit):
				t.Errorf("promtool check metrics found problems:\n%s", out.String())
			case err != nil:
				t.Fatalf("running promtool: %v", err)
			case strings.TrimSpace(out.String()) != "":
				t.Errorf("promtool check metrics printed findings:\n%s", out.String())
			}
		})
	}
}
