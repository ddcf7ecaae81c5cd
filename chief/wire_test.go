package chief

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/observe/metrics"
)

// The report's wire section divides every worker's bytes by every
// worker's steps, across a worker's restart (whose counts start from 0
// again); none when no worker reported a step.
func TestWireReportCountsRestartedWorkers(t *testing.T) {
	c, _ := trainingCore(t, metrics.NewChief(prometheus.NewRegistry()))
	if w := c.wireReport(); w.Steps != 0 || w.PushBytesPerStep != 0 || w.Compress != "none" {
		t.Fatalf("before any heartbeat: %+v", w)
	}
	c.WireCounts(0, 10, 1000, 2000)
	c.WireCounts(1, 5, 500, 1000)
	c.WireCounts(0, 20, 2000, 4000) // worker 0 again: counts since it started
	c.WireCounts(0, 4, 400, 800)    // worker 0 restarted
	c.WireCounts(0, 10, 1000, 2000)
	w := c.wireReport()
	// Worker 0: 20 steps before its restart, 10 since; worker 1: 5.
	if w.Steps != 35 || w.PushBytesPerStep != 100 || w.PullBytesPerStep != 200 {
		t.Fatalf("wire %+v, want 35 steps, 100 and 200 bytes per step", w)
	}
}
