package metrics

import "github.com/prometheus/client_golang/prometheus"

// Metric names. Tools that read metrics back through [Scrape] should use these
// constants rather than spelling the names out.
const (
	// Process-wide.
	MetricBuildInfo = "pstrain_build_info"

	// Host collector.
	MetricHostLoad1                = "pstrain_host_load1"
	MetricHostLoad5                = "pstrain_host_load5"
	MetricHostLoad15               = "pstrain_host_load15"
	MetricHostCPUSeconds           = "pstrain_host_cpu_seconds_total"
	MetricHostCPUs                 = "pstrain_host_cpus"
	MetricHostMemoryAvailableBytes = "pstrain_host_memory_available_bytes"
	MetricHostMemoryTotalBytes     = "pstrain_host_memory_total_bytes"

	// Shared by workers and parameter servers.
	MetricRPCSentBytes     = "pstrain_rpc_sent_bytes_total"
	MetricRPCReceivedBytes = "pstrain_rpc_received_bytes_total"

	// Shared by parameter servers and the chief.
	MetricGlobalStep = "pstrain_global_step"

	// Worker.
	MetricWorkerSteps     = "pstrain_worker_steps_total"
	MetricWorkerSamples   = "pstrain_worker_samples_total"
	MetricWorkerStepPhase = "pstrain_worker_step_phase_seconds"
	MetricTrainLoss       = "pstrain_train_loss"
	MetricWorkerRetries   = "pstrain_worker_retries_total"
	MetricWorkerShardRPC  = "pstrain_worker_shard_rpc_seconds"

	// Parameter server.
	MetricPSRequests              = "pstrain_ps_requests_total"
	MetricPSRequestDuration       = "pstrain_ps_request_duration_seconds"
	MetricPSGradientStaleness     = "pstrain_ps_gradient_staleness_steps"
	MetricPSStaleGradientsDropped = "pstrain_ps_stale_gradients_dropped_total"
	MetricSyncBarrierWait         = "pstrain_sync_barrier_wait_seconds"
	MetricPSShardParameters       = "pstrain_ps_shard_parameters"
	MetricPSRejectedRequests      = "pstrain_ps_rejected_requests_total"
	MetricPSConnectionsClosed     = "pstrain_ps_connections_closed_total"
	MetricPSDataPlaneConnections  = "pstrain_ps_dataplane_connections"
	MetricPSDataPlaneBuffered     = "pstrain_ps_dataplane_buffered_bytes"
	MetricPSRefusedGradients      = "pstrain_ps_refused_gradients_total"
	MetricPSGradientNormRatio     = "pstrain_ps_gradient_norm_ratio"
	MetricPSReplicaRole           = "pstrain_ps_replica_role"
	MetricPSReplicationLag        = "pstrain_ps_replication_lag_updates"
	MetricPSReplicationLagSeconds = "pstrain_ps_replication_lag_seconds"
	MetricPSReplicatedBytes       = "pstrain_ps_replicated_bytes_total"

	// Chief.
	MetricEvalAccuracy          = "pstrain_eval_accuracy_ratio"
	MetricEvalLoss              = "pstrain_eval_loss"
	MetricCheckpointDuration    = "pstrain_checkpoint_duration_seconds"
	MetricCheckpointSize        = "pstrain_checkpoint_size_bytes"
	MetricCheckpointLastSuccess = "pstrain_checkpoint_last_success_timestamp_seconds"
	MetricCheckpointFailures    = "pstrain_checkpoint_failures_total"
	MetricTaskRestarts          = "pstrain_task_restarts_total"
	MetricRecoverySeconds       = "pstrain_recovery_seconds"
	MetricStepsLost             = "pstrain_steps_lost_total"
	MetricLiveWorkers           = "pstrain_live_workers"
	MetricChiefRejectedRequests = "pstrain_chief_rejected_requests_total"
	MetricDivergences           = "pstrain_divergences_total"
	MetricQuarantined           = "pstrain_quarantined_workers_total"
	MetricMembershipChanges     = "pstrain_membership_changes_total"
	MetricWorkers               = "pstrain_workers"
	MetricFailovers             = "pstrain_failovers_total"
	MetricParameterServers      = "pstrain_parameter_servers"
	MetricLayoutChanges         = "pstrain_layout_changes_total"
	MetricRebalances            = "pstrain_rebalances_total"
)

// Label names.
const (
	LabelOp        = "op"        // RPC operation, e.g. "pull" or "push"
	LabelPhase     = "phase"     // worker step phase, one of the Phase constants
	LabelReason    = "reason"    // why a parameter server rejected a request, refused a gradient or closed a connection
	LabelPlane     = "plane"     // which listener of a parameter server: "grpc" or "data"
	LabelWorker    = "worker"    // a worker's index, on pstrain_ps_refused_gradients_total
	LabelRole      = "role"      // a PS process's replica role: primary, standby, deposed or none
	LabelShard     = "shard"     // a shard's index, on pstrain_failovers_total and pstrain_worker_shard_rpc_seconds
	LabelMode      = "mode"      // CPU mode of pstrain_host_cpu_seconds_total
	LabelVersion   = "version"   // pstrain version in pstrain_build_info
	LabelRevision  = "revision"  // VCS revision in pstrain_build_info ("unknown" if not stamped)
	LabelGoVersion = "goversion" // Go toolchain in pstrain_build_info
	// LabelRestartedTask is the task a restart counted in
	// pstrain_task_restarts_total was of, e.g. "worker/3". Not "task":
	// that is the scrape target's own label (the chief's), set by
	// `pstrain run`'s file_sd targets and the k8s ServiceMonitors, which
	// Prometheus would keep, renaming the metric's to exported_task.
	LabelRestartedTask = "restarted_task"
	// LabelTask is the task identity ("chief", "ps/0", "worker/3") that
	// service discovery puts on every target; no metric exports it.
	LabelTask = "task"
)

// Worker step phases, the values of the phase label of
// pstrain_worker_step_phase_seconds.
const (
	PhasePull    = "pull"    // fetching parameters from the parameter servers
	PhaseCompute = "compute" // forward and backward pass
	PhasePush    = "push"    // sending gradients to the parameter servers
	PhaseWait    = "wait"    // blocked on synchronisation (barriers, staleness bound)
)

// Phases lists the worker step phases in step order.
func Phases() []string { return []string{PhasePull, PhaseCompute, PhasePush, PhaseWait} }

// LatencyBuckets returns the histogram buckets used for request and phase
// latencies: 100µs doubling up to about 13 s (0.0001 * 2^k, k = 0..17), fine
// enough to separate loopback round trips.
func LatencyBuckets() []float64 { return prometheus.ExponentialBuckets(0.0001, 2, 18) }

// StalenessBuckets returns the buckets of pstrain_ps_gradient_staleness_steps,
// in steps.
func StalenessBuckets() []float64 {
	return []float64{0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64}
}

// CheckpointBuckets returns the buckets of
// pstrain_checkpoint_duration_seconds: 1 ms doubling up to about 131 s.
func CheckpointBuckets() []float64 { return prometheus.ExponentialBuckets(0.001, 2, 18) }

// RecoveryBuckets returns the buckets of pstrain_recovery_seconds: 10 ms
// doubling up to about 5.5 min.
func RecoveryBuckets() []float64 { return prometheus.ExponentialBuckets(0.01, 2, 16) }
