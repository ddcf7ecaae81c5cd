// Package bottleneck says where a training run's time goes, from the
// Prometheus metrics its processes export.
//
// The core is pure: [Extract] reduces one scrape of one task (a
// metrics.Families) to a small [Reading], and [Compute] turns readings of every
// task at two or more instants into a [Breakdown]: the share of the workers'
// step time spent computing, pushing, pulling and waiting at the sync barrier,
// each task's CPU use and RSS, the host load against its cores, the step rate,
// and a verdict naming the limiting resource. [Monitor] adds the scraping: it
// samples a list of targets through an injected scrape function and clock and
// computes breakdowns over a recent window or the whole run.
//
// Counters are read the way Prometheus' increase() reads them: a value lower
// than the previous one means the process restarted, and the new value is
// the increase since the restart.
package bottleneck

import (
	"net/url"
	"strings"

	"github.com/pstrain/pstrain/observe/metrics"
)

// Roles of pstrain tasks, the values of [Target.Role].
const (
	RoleChief  = "chief"
	RolePS     = "ps"
	RoleWorker = "worker"
)

// Target names one task's metrics endpoint.
type Target struct {
	// Task is the task's name, e.g. "ps/0" or "worker/1".
	Task string `json:"task"`
	// Role is "chief", "ps" or "worker"; empty means: infer it from the task
	// name, or else from the metrics the task exports.
	Role string `json:"role,omitempty"`
	// URL is the full metrics URL, e.g. "http://127.0.0.1:9401/metrics".
	URL string `json:"url"`
}

// Host returns the host part of the target's URL ("" if it has none); tasks
// on the same host share its load and cores.
func (t Target) Host() string {
	u, err := url.Parse(t.URL)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// role returns the target's role: Role if set, else the part of Task before
// "/" if it is a known role, else "".
func (t Target) role() string {
	if t.Role != "" {
		return t.Role
	}
	r, _, _ := strings.Cut(t.Task, "/")
	switch r {
	case RoleChief, RolePS, RoleWorker:
		return r
	}
	return ""
}

// Keys of Reading.Counters.
const (
	keySteps        = "steps"
	keySamples      = "samples"
	keyCPU          = "cpu_seconds"
	keyBarrierSum   = "barrier_sum"
	keyBarrierCount = "barrier_count"
	keyHostCPUTotal = "host_cpu_total"
	keyHostCPUBusy  = "host_cpu_busy"
	keyPhaseSum     = "phase_sum:"   // + phase
	keyPhaseCount   = "phase_count:" // + phase
	keyShardSum     = "shard_sum:"   // + shard: a worker's pushes to it and pulls from it
	keyPushCount    = "push_count:"  // + shard: its pushes to it
)

// Keys of Reading.Gauges.
const (
	keyRSS         = "rss"
	keyLoad1       = "load1"
	keyHostCPUs    = "host_cpus"
	keyShardParams = "shard_params"
)

// Metric names read from client_golang's process collector.
const (
	metricProcessCPU = "process_cpu_seconds_total"
	metricProcessRSS = "process_resident_memory_bytes"
)

// Reading is what the breakdown needs from one scrape of one task: counter
// values (cumulative since the process started) and gauge values, by
// internal key. A metric the task does not export has no key.
type Reading struct {
	// Counters holds cumulative values: steps, CPU seconds, the sum and count
	// of each step-phase histogram, of the barrier-wait histogram, and the
	// host's CPU seconds (total and busy).
	Counters map[string]float64
	// Gauges holds instantaneous values: RSS, host load1, host CPU count.
	Gauges map[string]float64
	// Role is the role inferred from the metrics: "worker" when the task
	// exports step phases, "ps" when it exports barrier waits, "chief" when
	// it exports evaluation results, else "".
	Role string
	// Replica is a PS process's place in its shard's replication
	// (pstrain_ps_replica_role: primary, standby, deposed, none; "" when
	// not exported).
	Replica string
}

// Extract reduces one scrape of one task to a Reading. It never fails:
// families that are absent or of an unexpected type are left out.
func Extract(f metrics.Families) Reading {
	r := Reading{Counters: map[string]float64{}, Gauges: map[string]float64{}}
	counter := func(key, name string) {
		if v, ok := f.Value(name, nil); ok {
			r.Counters[key] = v
		}
	}
	gauge := func(key, name string) {
		if v, ok := f.Value(name, nil); ok {
			r.Gauges[key] = v
		}
	}
	counter(keySteps, metrics.MetricWorkerSteps)
	counter(keySamples, metrics.MetricWorkerSamples)
	counter(keyCPU, metricProcessCPU)
	gauge(keyRSS, metricProcessRSS)
	gauge(keyLoad1, metrics.MetricHostLoad1)
	gauge(keyHostCPUs, metrics.MetricHostCPUs)
	gauge(keyShardParams, metrics.MetricPSShardParameters)

	extractHistograms(f, r.Counters)
	extractHostCPU(f, r.Counters)
	for _, s := range f.Series(metrics.MetricPSReplicaRole, nil) {
		if s.Value == 1 {
			r.Replica = s.Labels[metrics.LabelRole]
		}
	}
	r.Role = roleOf(f)
	return r
}

// extractHistograms puts the sum and count of the step-phase and
// barrier-wait histograms, and a worker's time on each shard and its
// pushes to it, into counters.
func extractHistograms(f metrics.Families, counters map[string]float64) {
	for _, p := range metrics.Phases() {
		if h, ok := f.Histogram(metrics.MetricWorkerStepPhase, map[string]string{metrics.LabelPhase: p}); ok {
			counters[keyPhaseSum+p] = h.Sum
			counters[keyPhaseCount+p] = float64(h.Count)
		}
	}
	if h, ok := f.Histogram(metrics.MetricSyncBarrierWait, nil); ok {
		counters[keyBarrierSum] = h.Sum
		counters[keyBarrierCount] = float64(h.Count)
	}
	for _, shard := range f.LabelValues(metrics.MetricWorkerShardRPC, metrics.LabelShard) {
		if h, ok := f.Histogram(metrics.MetricWorkerShardRPC, map[string]string{metrics.LabelShard: shard}); ok {
			counters[keyShardSum+shard] = h.Sum // (pushes and pulls)
		}
		if h, ok := f.Histogram(metrics.MetricWorkerShardRPC, map[string]string{metrics.LabelShard: shard, metrics.LabelOp: "push"}); ok {
			counters[keyPushCount+shard] = float64(h.Count)
		}
	}
}

// extractHostCPU puts the host's total and busy (not idle or I/O wait) CPU
// seconds into counters, when the host exports them.
func extractHostCPU(f metrics.Families, counters map[string]float64) {
	cpu := f.Series(metrics.MetricHostCPUSeconds, nil)
	if len(cpu) == 0 {
		return
	}
	var total, idle float64
	for _, s := range cpu {
		total += s.Value
		if m := s.Labels[metrics.LabelMode]; m == "idle" || m == "iowait" {
			idle += s.Value
		}
	}
	counters[keyHostCPUTotal] = total
	counters[keyHostCPUBusy] = total - idle
}

// roleOf infers a task's role from the families it exports (see
// Reading.Role).
func roleOf(f metrics.Families) string {
	switch {
	case f.Has(metrics.MetricWorkerStepPhase) || f.Has(metrics.MetricWorkerSteps):
		return RoleWorker
	case f.Has(metrics.MetricSyncBarrierWait) || f.Has(metrics.MetricPSRequests):
		return RolePS
	case f.Has(metrics.MetricEvalAccuracy):
		return RoleChief
	}
	return ""
}
