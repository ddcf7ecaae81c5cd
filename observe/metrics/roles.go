package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Worker holds the metrics of a training worker. Create it with [NewWorker].
type Worker struct {
	// Steps counts completed training steps (pstrain_worker_steps_total).
	Steps prometheus.Counter
	// Samples counts training examples processed
	// (pstrain_worker_samples_total).
	Samples prometheus.Counter
	// StepPhase observes the time spent in each phase of a step, in seconds,
	// by phase label (pstrain_worker_step_phase_seconds). The series of the
	// four [Phases] exist from the start. See also [Worker.ObservePhase].
	StepPhase *prometheus.HistogramVec
	// TrainLoss is the training loss of the most recent step
	// (pstrain_train_loss).
	TrainLoss prometheus.Gauge
	// RPCSentBytes counts request payload bytes sent, by op label
	// (pstrain_rpc_sent_bytes_total).
	RPCSentBytes *prometheus.CounterVec
	// RPCReceivedBytes counts response payload bytes received, by op label
	// (pstrain_rpc_received_bytes_total).
	RPCReceivedBytes *prometheus.CounterVec
	// Retries counts RPCs retried after a failure
	// (pstrain_worker_retries_total).
	Retries prometheus.Counter
	// ShardRPC observes how long each push to a shard and each pull from
	// it took, from sending it to the shard's answer, by op and shard
	// label (pstrain_worker_shard_rpc_seconds): how long each parameter
	// server keeps the workers, as they see it (docs/elastic.md,
	// "Rebalancing").
	ShardRPC *prometheus.HistogramVec
}

// NewWorker creates the worker metrics and registers them on reg (a nil reg
// leaves them unregistered). It panics if any of them is already registered on
// reg.
func NewWorker(reg prometheus.Registerer) *Worker {
	f := promauto.With(reg)
	w := &Worker{
		Steps: f.NewCounter(prometheus.CounterOpts{
			Name: MetricWorkerSteps,
			Help: "Training steps this worker has completed.",
		}),
		Samples: f.NewCounter(prometheus.CounterOpts{
			Name: MetricWorkerSamples,
			Help: "Training examples this worker has processed.",
		}),
		StepPhase: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricWorkerStepPhase,
			Help:    "Time a training step spent in each phase (pull, compute, push, wait), in seconds.",
			Buckets: LatencyBuckets(),
		}, []string{LabelPhase}),
		TrainLoss: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricTrainLoss,
			Help: "Training loss of this worker's most recent step.",
		}),
		RPCSentBytes:     newRPCSentBytes(f),
		RPCReceivedBytes: newRPCReceivedBytes(f),
		Retries: f.NewCounter(prometheus.CounterOpts{
			Name: MetricWorkerRetries,
			Help: "RPCs this worker retried after a failure.",
		}),
		ShardRPC: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricWorkerShardRPC,
			Help:    "Time a push to a parameter server, or a pull from it, took from sending it to its answer, by op and shard, in seconds.",
			Buckets: LatencyBuckets(),
		}, []string{LabelOp, LabelShard}),
	}
	for _, p := range Phases() {
		w.StepPhase.WithLabelValues(p)
	}
	return w
}

// ObservePhase records that a step spent d in phase (one of the Phase
// constants).
func (w *Worker) ObservePhase(phase string, d time.Duration) {
	w.StepPhase.WithLabelValues(phase).Observe(d.Seconds())
}

// PS holds the metrics of a parameter-server shard. Create it with [NewPS].
type PS struct {
	// Requests counts requests handled, by op label
	// (pstrain_ps_requests_total).
	Requests *prometheus.CounterVec
	// RequestDuration observes the time to handle a request, in seconds, by
	// op label (pstrain_ps_request_duration_seconds).
	RequestDuration *prometheus.HistogramVec
	// GradientStaleness observes, for each gradient applied or dropped, how
	// many steps behind the current global step it was computed
	// (pstrain_ps_gradient_staleness_steps).
	GradientStaleness prometheus.Histogram
	// StaleGradientsDropped counts gradients discarded for exceeding the
	// staleness bound (pstrain_ps_stale_gradients_dropped_total).
	StaleGradientsDropped prometheus.Counter
	// BarrierWait observes how long a pull waited for the parameter version it
	// needs, in seconds (pstrain_sync_barrier_wait_seconds).
	BarrierWait prometheus.Histogram
	// GlobalStep is the shard's current global step (pstrain_global_step).
	GlobalStep prometheus.Gauge
	// ShardParameters is the number of scalar parameters this shard holds
	// (pstrain_ps_shard_parameters).
	ShardParameters prometheus.Gauge
	// RPCSentBytes counts response payload bytes sent, by op label
	// (pstrain_rpc_sent_bytes_total).
	RPCSentBytes *prometheus.CounterVec
	// RPCReceivedBytes counts request payload bytes received, by op label
	// (pstrain_rpc_received_bytes_total).
	RPCReceivedBytes *prometheus.CounterVec
	// RejectedRequests counts requests refused, by reason label
	// (pstrain_ps_rejected_requests_total). The data plane adds
	// too_large (a payload above the shard's gradient or the buffer
	// budget), busy (no room in the buffer budget in time) and
	// bad_frame.
	RejectedRequests *prometheus.CounterVec
	// ConnectionsClosed counts connections refused or cut without a
	// request refused, by plane ("grpc", "data") and reason: limit (over
	// the connection limit), tls (handshake failed), idle (no request
	// for the idle timeout), slow (a frame or response not done in time)
	// (pstrain_ps_connections_closed_total).
	ConnectionsClosed *prometheus.CounterVec
	// DataPlaneConnections is the number of open data-plane connections
	// (pstrain_ps_dataplane_connections).
	DataPlaneConnections prometheus.Gauge
	// DataPlaneBuffered is the bytes of push payload buffers the data
	// plane holds, in use or kept for reuse; never above its budget
	// (pstrain_ps_dataplane_buffered_bytes).
	DataPlaneBuffered prometheus.Gauge
	// RefusedGradients counts the gradients the divergence guard refused,
	// by worker index and reason (norm or non_finite)
	// (pstrain_ps_refused_gradients_total).
	RefusedGradients *prometheus.CounterVec
	// GradientNormRatio observes each judged gradient's L2 norm over the
	// norm guard's reference, the median of the recent accepted norms
	// (pstrain_ps_gradient_norm_ratio).
	GradientNormRatio prometheus.Histogram
	// Hot standbys (docs/replication.md). ReplicaRole is 1 for this
	// process's role (primary, standby, deposed or none) and 0 for the
	// others (pstrain_ps_replica_role); ReplicationLag and
	// ReplicationLagSeconds are a primary's updates not yet acknowledged
	// by its standby and how long they have waited (since the oldest, or
	// the standby's last acknowledgement if later)
	// (pstrain_ps_replication_lag_updates, _seconds); ReplicatedBytes
	// counts the bytes a primary sent its standby, snapshots included
	// (pstrain_ps_replicated_bytes_total).
	ReplicaRole           *prometheus.GaugeVec
	ReplicationLag        prometheus.Gauge
	ReplicationLagSeconds prometheus.Gauge
	ReplicatedBytes       prometheus.Counter
	// Tables are the shard's embedding-table metrics (tables.go).
	Tables *Tables
}

// NewPS creates the parameter-server metrics and registers them on reg (a nil
// reg leaves them unregistered). It panics if any of them is already
// registered on reg; in particular PS and [Chief] cannot share a registry,
// since both export pstrain_global_step. It is NewPSWith(reg, PSOptions{}).
func NewPS(reg prometheus.Registerer) *PS { return NewPSWith(reg, PSOptions{}) }

// PSOptions configure [NewPSWith].
type PSOptions struct {
	// NoBarrier leaves pstrain_sync_barrier_wait_seconds unregistered
	// (BarrierWait still works, unexported): under async SGD a pull never
	// waits for other workers, and the little time it does take (the
	// shard's lock, the snapshot) is no barrier. Its absence is what tells
	// `pstrain top` and the bottleneck line there is no barrier wait.
	NoBarrier bool
}

// NewPSWith is [NewPS] with options.
func NewPSWith(reg prometheus.Registerer, o PSOptions) *PS {
	f := promauto.With(reg)
	barrier := f
	if o.NoBarrier {
		barrier = promauto.With(nil)
	}
	return &PS{
		Requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPSRequests,
			Help: "Requests this parameter-server shard has handled, by operation.",
		}, []string{LabelOp}),
		RequestDuration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricPSRequestDuration,
			Help:    "Time this parameter-server shard took to handle a request, by operation, in seconds.",
			Buckets: LatencyBuckets(),
		}, []string{LabelOp}),
		GradientStaleness: f.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricPSGradientStaleness,
			Help:    "Staleness of received gradients: global step at arrival minus the step they were computed at, in steps.",
			Buckets: StalenessBuckets(),
		}),
		StaleGradientsDropped: f.NewCounter(prometheus.CounterOpts{
			Name: MetricPSStaleGradientsDropped,
			Help: "Gradients this parameter-server shard discarded for exceeding the staleness bound.",
		}),
		BarrierWait: barrier.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricSyncBarrierWait,
			Help:    "Time a pull waited for the parameter version it needs, in seconds.",
			Buckets: LatencyBuckets(),
		}),
		GlobalStep: newGlobalStep(f),
		ShardParameters: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricPSShardParameters,
			Help: "Number of scalar parameters held by this parameter-server shard.",
		}),
		RPCSentBytes: newRPCSentBytes(f), RPCReceivedBytes: newRPCReceivedBytes(f), Tables: NewTables(reg),
		RejectedRequests: f.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPSRejectedRequests,
			Help: "Requests this parameter-server shard refused, by reason.",
		}, []string{LabelReason}),
		ConnectionsClosed: f.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPSConnectionsClosed,
			Help: "Connections this parameter server refused or cut (over the limit, failed TLS, idle, too slow), by plane and reason.",
		}, []string{LabelPlane, LabelReason}),
		DataPlaneConnections: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricPSDataPlaneConnections,
			Help: "Open connections of this parameter server's TCP data plane.",
		}),
		DataPlaneBuffered: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricPSDataPlaneBuffered,
			Help: "Bytes of push payload buffers this parameter server's TCP data plane holds (in use or kept for reuse).",
		}),
		RefusedGradients: f.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPSRefusedGradients,
			Help: "Gradients this parameter-server shard refused and never applied, by worker and reason (norm: beyond the norm guard; non_finite: NaN or Inf).",
		}, []string{LabelWorker, LabelReason}),
		GradientNormRatio: f.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricPSGradientNormRatio,
			Help:    "Each judged gradient's L2 norm over the median of this shard's recent accepted norms (the norm guard refuses beyond --norm-guard).",
			Buckets: NormRatioBuckets(),
		}),
		ReplicaRole: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricPSReplicaRole,
			Help: "1 for this parameter-server process's replica role (primary, standby, deposed, none), 0 for the others.",
		}, []string{LabelRole}),
		ReplicationLag: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricPSReplicationLag,
			Help: "Updates this primary applied that its hot standby has not yet acknowledged.",
		}),
		ReplicationLagSeconds: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricPSReplicationLagSeconds,
			Help: "How long updates this primary applied have waited for its hot standby's acknowledgement, in seconds: since the oldest was queued, or since the standby's last acknowledgement if later (0: none waits).",
		}),
		ReplicatedBytes: f.NewCounter(prometheus.CounterOpts{
			Name: MetricPSReplicatedBytes,
			Help: "Bytes this primary sent its hot standby (snapshots and updates).",
		}),
	}
}

// NormRatioBuckets are the buckets of pstrain_ps_gradient_norm_ratio:
// 1/8 doubling up to 1024.
func NormRatioBuckets() []float64 { return prometheus.ExponentialBuckets(0.125, 2, 14) }

// Chief holds the metrics of the chief (coordinator). Create it with
// [NewChief].
type Chief struct {
	// GlobalStep is the global step as seen by the chief
	// (pstrain_global_step).
	GlobalStep prometheus.Gauge
	// EvalAccuracy is the accuracy of the latest evaluation, between 0 and 1
	// (pstrain_eval_accuracy_ratio).
	EvalAccuracy prometheus.Gauge
	// EvalLoss is the loss of the latest evaluation (pstrain_eval_loss).
	EvalLoss prometheus.Gauge
	// CheckpointDuration observes the time to write a checkpoint, in seconds
	// (pstrain_checkpoint_duration_seconds).
	CheckpointDuration prometheus.Histogram
	// CheckpointSize is the size of the latest checkpoint, in bytes
	// (pstrain_checkpoint_size_bytes).
	CheckpointSize prometheus.Gauge
	// CheckpointLastSuccess is the Unix time of the latest successful
	// checkpoint, in seconds (pstrain_checkpoint_last_success_timestamp_seconds).
	// Set it with [prometheus.Gauge.SetToCurrentTime].
	CheckpointLastSuccess prometheus.Gauge
	// CheckpointFailures counts checkpoint attempts that failed (a shard
	// or the manifest could not be written: a full disk, an I/O error, a
	// shard that restarted) (pstrain_checkpoint_failures_total).
	CheckpointFailures prometheus.Counter
	// TaskRestarts counts restarts of each task, by restarted_task label
	// (pstrain_task_restarts_total).
	TaskRestarts *prometheus.CounterVec
	// Recovery observes the time from detecting a failed task to training
	// resuming, in seconds (pstrain_recovery_seconds).
	Recovery prometheus.Histogram
	// StepsLost counts training steps redone after recoveries rolled back to
	// a checkpoint (pstrain_steps_lost_total).
	StepsLost prometheus.Counter
	// LiveWorkers is the number of workers currently alive
	// (pstrain_live_workers).
	LiveWorkers prometheus.Gauge
	// RejectedRequests counts registrations and heartbeats refused, by
	// reason: config (a differing run configuration or model), task (an
	// unknown role or index), run_id (a heartbeat of another run)
	// (pstrain_chief_rejected_requests_total).
	RejectedRequests *prometheus.CounterVec
	// Divergences counts the times the model diverged and was rolled back
	// (pstrain_divergences_total).
	Divergences prometheus.Counter
	// Quarantined counts the workers attribution quarantined
	// (pstrain_quarantined_workers_total, docs/security.md).
	Quarantined prometheus.Counter
	// MembershipChanges counts the changes of an elastic run's worker
	// count that took effect (pstrain_membership_changes_total), and
	// Workers is the count in effect (pstrain_workers; the live ones are
	// pstrain_live_workers).
	MembershipChanges prometheus.Counter
	Workers           prometheus.Gauge
	// PS is the number of parameter servers holding the model
	// (pstrain_parameter_servers), and LayoutChanges counts the changes
	// of it that took effect (pstrain_layout_changes_total;
	// docs/elastic.md, "Parameter servers"), rebalances included;
	// Rebalances counts those that kept the count and moved rows between
	// the shards (pstrain_rebalances_total; "Rebalancing").
	PS            prometheus.Gauge
	LayoutChanges prometheus.Counter
	Rebalances    prometheus.Counter
	// Failovers counts the promotions of a hot standby to its shard's
	// primary, by shard (pstrain_failovers_total; docs/replication.md).
	Failovers *prometheus.CounterVec
}

// NewChief creates the chief metrics and registers them on reg (a nil reg
// leaves them unregistered). It panics if any of them is already registered on
// reg; in particular Chief and [PS] cannot share a registry, since both export
// pstrain_global_step.
func NewChief(reg prometheus.Registerer) *Chief {
	f := promauto.With(reg)
	c := &Chief{
		GlobalStep: newGlobalStep(f),
		EvalAccuracy: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricEvalAccuracy,
			Help: "Accuracy of the latest evaluation, as a ratio between 0 and 1.",
		}),
		EvalLoss: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricEvalLoss,
			Help: "Loss of the latest evaluation.",
		}),
		CheckpointDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricCheckpointDuration,
			Help:    "Time taken to write a checkpoint, in seconds.",
			Buckets: CheckpointBuckets(),
		}),
		CheckpointSize: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricCheckpointSize,
			Help: "Size of the latest checkpoint, in bytes.",
		}),
		CheckpointLastSuccess: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricCheckpointLastSuccess,
			Help: "Unix time of the latest successful checkpoint, in seconds.",
		}),
		CheckpointFailures: f.NewCounter(prometheus.CounterOpts{
			Name: MetricCheckpointFailures,
			Help: "Checkpoint attempts that failed.",
		}),
		TaskRestarts: f.NewCounterVec(prometheus.CounterOpts{
			Name: MetricTaskRestarts,
			Help: "Times the chief restarted each task, by restarted_task.",
		}, []string{LabelRestartedTask}),
		Recovery: f.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricRecoverySeconds,
			Help:    "Time from detecting a failed task to training resuming, in seconds.",
			Buckets: RecoveryBuckets(),
		}),
		StepsLost: f.NewCounter(prometheus.CounterOpts{
			Name: MetricStepsLost,
			Help: "Training steps lost to failures and redone after restoring a checkpoint.",
		}),
		LiveWorkers: f.NewGauge(prometheus.GaugeOpts{
			Name: MetricLiveWorkers,
			Help: "Number of workers currently alive.",
		}),
		RejectedRequests: f.NewCounterVec(prometheus.CounterOpts{
			Name: MetricChiefRejectedRequests,
			Help: "Registrations and heartbeats the chief refused, by reason.",
		}, []string{LabelReason}),
		Divergences: f.NewCounter(prometheus.CounterOpts{
			Name: MetricDivergences,
			Help: "Times the model diverged (its test loss was not finite or exploded); each is rolled back to a checkpoint unless training had ended.",
		}),
		Quarantined: f.NewCounter(prometheus.CounterOpts{
			Name: MetricQuarantined,
			Help: "Workers the chief quarantined because their gradients pointed away from the model's progress; their gradients are refused.",
		}),
	}
	addElastic(f, c)
	return c
}

// addElastic creates the chief's metrics of worker and PS changes and of
// failovers on c.
func addElastic(f promauto.Factory, c *Chief) {
	c.MembershipChanges = f.NewCounter(prometheus.CounterOpts{
		Name: MetricMembershipChanges,
		Help: "Changes of the worker count (pstrain scale, or a worker registering with the next index) that took effect at a step boundary.",
	})
	c.Workers = f.NewGauge(prometheus.GaugeOpts{
		Name: MetricWorkers,
		Help: "Workers the run has (the data is split among them); pstrain_live_workers counts those heard from.",
	})
	c.PS = f.NewGauge(prometheus.GaugeOpts{
		Name: MetricParameterServers,
		Help: "Parameter servers holding the model (pstrain scale --ps changes it at a step boundary).",
	})
	c.LayoutChanges = f.NewCounter(prometheus.CounterOpts{
		Name: MetricLayoutChanges,
		Help: "Changes of the parameter servers' layout (their count, or a rebalance) that took effect.",
	})
	c.Rebalances = f.NewCounter(prometheus.CounterOpts{
		Name: MetricRebalances,
		Help: "Rebalances that took effect: rows moved from slower parameter servers to faster ones (pstrain scale --rebalance).",
	})
	c.Failovers = f.NewCounterVec(prometheus.CounterOpts{
		Name: MetricFailovers,
		Help: "Times the chief promoted a shard's hot standby to primary, by shard.",
	}, []string{LabelShard})
}

func newGlobalStep(f promauto.Factory) prometheus.Gauge {
	return f.NewGauge(prometheus.GaugeOpts{
		Name: MetricGlobalStep,
		Help: "Current global training step (number of applied updates).",
	})
}

func newRPCSentBytes(f promauto.Factory) *prometheus.CounterVec {
	return f.NewCounterVec(prometheus.CounterOpts{
		Name: MetricRPCSentBytes,
		Help: "Payload bytes this process sent in RPCs, by operation.",
	}, []string{LabelOp})
}

func newRPCReceivedBytes(f promauto.Factory) *prometheus.CounterVec {
	return f.NewCounterVec(prometheus.CounterOpts{
		Name: MetricRPCReceivedBytes,
		Help: "Payload bytes this process received in RPCs, by operation.",
	}, []string{LabelOp})
}
