// Package report defines the JSON summary of a run (`pstrain run
// --report FILE.json`). Field names are a contract: sweeps, plots and
// external tools read them.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pstrain/pstrain/internal/atomicfile"
	"github.com/pstrain/pstrain/observe/bottleneck"
)

// Eval is one evaluation on the test set.
type Eval struct {
	Step         int64   `json:"step"`
	Seconds      float64 `json:"seconds"` // since the first step, when the weights were read
	TestAccuracy float64 `json:"test_accuracy"`
	// TestLoss is the mean cross-entropy; a loss that was not finite (a
	// diverged model) is written as the largest float64, 1.8e308, since
	// JSON has no NaN or Inf.
	TestLoss float64 `json:"test_loss"`
	// TestSamples is how many test samples were scored; Subset is set
	// when that was a fixed subset of the test set (a routine first pass)
	// rather than all of it.
	TestSamples int  `json:"test_samples,omitempty"`
	Subset      bool `json:"subset,omitempty"`
	// AUC and NormalizedEntropy score a CTR model (TestLoss is then its
	// log loss, TestAccuracy that of predicting a click at probability
	// 0.5 or more); absent for other models.
	AUC               float64 `json:"auc,omitempty"`
	NormalizedEntropy float64 `json:"normalized_entropy,omitempty"`
}

// Restart is one recovered task. In the report of `pstrain run` its
// times are seconds since the run started (the clock of --fault; the
// chief alone counts from the first step).
type Restart struct {
	Task string `json:"task"`
	// Cause is why the process ended, as the launcher saw it:
	// unresponsive, fault, signal, exit-nonzero or exit-zero for a
	// restart; quarantined, removed or killed-after-training for a
	// process that was not restarted (launcher's Cause constants; empty
	// when no launcher saw it).
	Cause           string   `json:"cause,omitempty"`
	KilledAtSeconds float64  `json:"killed_at_seconds"`
	BackAtSeconds   *float64 `json:"back_at_seconds"`
	// RestoredStep is the step it was back at (-1: it was not back in
	// training before the run ended).
	RestoredStep int64 `json:"restored_step"`
	// StepsLost is how many steps training went back: the newest version
	// any shard had reached minus RestoredStep (0 for a hot standby's
	// failover: the standby held every acknowledged update).
	StepsLost int64 `json:"steps_lost"`
	// TookOver names the hot standby promoted in the dead task's place
	// ("standby/0"; docs/replication.md), and FailoverSeconds the time
	// from detecting the death to the promoted primary serving; empty
	// and 0 when the shard was restored from a checkpoint.
	TookOver        string  `json:"took_over,omitempty"`
	FailoverSeconds float64 `json:"failover_seconds,omitempty"`
}

// MembershipChange is a change of an elastic run's worker count or,
// with Role "ps", of its parameter server count (docs/elastic.md).
type MembershipChange struct {
	// Role is "ps" for a change of the parameter servers ("": workers).
	Role    string  `json:"role,omitempty"`
	Step    int64   `json:"step"`    // the step boundary it took effect at
	Epoch   int64   `json:"epoch"`   // the data epoch that starts there
	Seconds float64 `json:"seconds"` // since the first step, when it took effect
	// AskedSeconds is when it was asked for (pstrain scale, or a worker
	// registering with the next index).
	AskedSeconds float64 `json:"asked_seconds"`
	From         int     `json:"from"` // workers (or parameter servers) before
	To           int     `json:"to"`   // and after
	// PauseSeconds (PS changes) is how long the shards held every
	// worker's pull at the boundary, and StepsLost the steps the move
	// took back (the boundary minus the version the new shards serve
	// from).
	PauseSeconds *float64 `json:"pause_seconds,omitempty"`
	StepsLost    *int64   `json:"steps_lost,omitempty"`
	// Kind is "rebalance" for a PS change that kept the count and moved
	// rows between the shards (docs/elastic.md, "Rebalancing"; "": a
	// change of the count). Weights are the new layout's shard weights
	// (none: equal shares), Imbalance the slowest shard's time per
	// gradient over the fastest's that asked for it, and MovedParameters
	// the parameters the change moved between parameter servers.
	Kind            string  `json:"kind,omitempty"`
	Weights         []int   `json:"weights,omitempty"`
	Imbalance       float64 `json:"imbalance,omitempty"`
	MovedParameters int     `json:"moved_parameters,omitempty"`
}

// DataQueue is an async or ssp run's data queue (docs/elastic.md, "The
// data queue"): epochs of ChunksPerEpoch chunks of ChunkBatches
// batches, ChunksHandedOut of them handed to the workers, and the
// batches each worker read (its position at its last heartbeat: the
// faster a worker, the more).
type DataQueue struct {
	ChunkBatches    int     `json:"chunk_batches"`
	ChunksPerEpoch  int64   `json:"chunks_per_epoch"`
	ChunksHandedOut int64   `json:"chunks_handed_out"`
	BatchesRead     []int64 `json:"batches_read"`
}

// LedgerEntry is one epoch's data ledger: samples read twice into the
// model and samples skipped (their gradients are missing from the model
// or from part of it).
type LedgerEntry struct {
	Epoch     int64 `json:"epoch"`
	ReadTwice int64 `json:"read_twice"`
	Skipped   int64 `json:"skipped"`
}

// Suspect is a worker attribution named: why, and at which step.
type Suspect struct {
	Worker string `json:"worker"`
	Reason string `json:"reason"`
	AtStep int64  `json:"at_step"`
}

// Divergence is one time the model diverged: an evaluation's test loss
// was not finite or exploded against the best so far
// (docs/security.md, "The divergence guard").
type Divergence struct {
	AtStep  int64   `json:"at_step"` // the version of the diverged model
	Seconds float64 `json:"seconds"` // since the first step, when it was evaluated
	// TestLoss is the diverged model's (1.8e308 if not finite), BestLoss
	// the lowest of the run before it.
	TestLoss float64 `json:"test_loss"`
	BestLoss float64 `json:"best_loss"`
	// RolledBackTo is the step of the checkpoint the shards were rolled
	// back to (0 with no checkpoint: the initial weights; -1: not rolled
	// back, training had ended).
	RolledBackTo int64 `json:"rolled_back_to"`
	// LRFactor is the learning rate's factor from then on (halved at
	// each rollback).
	LRFactor float64 `json:"lr_factor"`
	// SuspectWorker names the worker whose gradients stood out
	// ("worker/1"), "" if none did; Evidence says how.
	SuspectWorker string `json:"suspect_worker"`
	Evidence      string `json:"evidence,omitempty"`
}

// Checkpoints are the run's checkpoint attempts: committed, failed, and
// the last failure's message. FinalFailed says the checkpoint taken when
// training ended failed: the trained model is not saved (the chief, and
// `pstrain run`, then exit with status 3).
type Checkpoints struct {
	Committed   int    `json:"committed"`
	Failed      int    `json:"failed"`
	LastError   string `json:"last_error,omitempty"`
	FinalFailed bool   `json:"final_failed,omitempty"`
}

// HandedBack is the model a run handed back in place of its ruined
// final model: the step it is of (FinalStep), whether it came from a
// checkpoint (else it is the initial model), and the ruined model's step,
// accuracy and why it was ruined. Tried are the steps of the checkpoints
// restored on the way that scored worse than the initial model too.
type HandedBack struct {
	Step               int64   `json:"step"`
	FromCheckpoint     bool    `json:"from_checkpoint"`
	RuinedStep         int64   `json:"ruined_step"`
	RuinedTestAccuracy float64 `json:"ruined_test_accuracy"`
	Why                string  `json:"why"`
	Tried              []int64 `json:"tried,omitempty"`
	// Err says why handing back an earlier model failed ("": it did
	// not); the ruined model is then the run's last.
	Err string `json:"error,omitempty"`
}

// Task is one process's resource use.
type Task struct {
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	ExitCode     int     `json:"exit_code"`
	Restarts     int     `json:"restarts"`
	// Ended says why the task's last process ended before the run did,
	// or was killed at its end, and was not restarted (a restarts[].cause:
	// quarantined, removed, killed-after-training); "" when it ended
	// with the run.
	Ended string `json:"ended,omitempty"`
}

// LiveWorkers is a change of the number of workers training: the
// count from Seconds on (the chief's clock, as evals[].seconds).
type LiveWorkers struct {
	Seconds float64 `json:"seconds"`
	Workers int     `json:"workers"`
}

// Report is the summary of a run.
type Report struct {
	Mode                  string   `json:"mode"`
	PS                    int      `json:"ps"`
	Workers               int      `json:"workers"`
	ReplicasToAggregate   int      `json:"replicas_to_aggregate"`
	Staleness             int      `json:"staleness"`
	Hidden                []int    `json:"hidden"`
	Model                 string   `json:"model"`
	Optimizer             string   `json:"optimizer"`
	Batch                 int      `json:"batch"`
	LR                    float64  `json:"lr"`
	LRSchedule            string   `json:"lr_schedule"`
	WarmupSteps           int64    `json:"warmup_steps"`
	Momentum              float64  `json:"momentum"`
	Epochs                float64  `json:"epochs"`
	EpochsDone            float64  `json:"epochs_done"`
	DataFraction          float64  `json:"data_fraction"`
	Dataset               string   `json:"dataset"`
	Seed                  int64    `json:"seed"`
	TargetAccuracy        float64  `json:"target_accuracy"`
	GlobalSteps           int64    `json:"global_steps"`
	TestAccuracy          float64  `json:"test_accuracy"`
	BestTestAccuracy      float64  `json:"best_test_accuracy"`
	StartupSeconds        float64  `json:"startup_seconds"`
	TrainSeconds          float64  `json:"train_seconds"`
	TestSeconds           float64  `json:"test_seconds"` // total time spent evaluating
	TimeToTargetSeconds   *float64 `json:"time_to_target_seconds"`
	SamplesPerSecond      float64  `json:"samples_per_second"`
	StaleGradientsDropped int64    `json:"stale_gradients_dropped"`
	// StoppedBy is why training stopped: target (the target accuracy was
	// held for TargetHold evaluations in a row), plateau (Patience
	// evaluations in a row scored no lower test loss than the best),
	// epochs, interrupted, or failed (the model kept diverging).
	StoppedBy string `json:"stopped_by"`
	// FinalStep is the version of the model handed back (the final
	// checkpoint's); TestAccuracy is that model's, on the whole test set.
	FinalStep  int64 `json:"final_step"`
	TargetHold int   `json:"target_hold"`
	// Patience is the run's --patience (0: off).
	Patience int `json:"patience,omitempty"`
	// AUC, LogLoss and NormalizedEntropy are a CTR model's scores on the
	// whole test set, of the model handed back, as TestAccuracy;
	// PlantedAUC is the best AUC achievable on the synthetic data set
	// (its planted model's). Absent for other models.
	AUC               float64 `json:"auc,omitempty"`
	LogLoss           float64 `json:"logloss,omitempty"`
	NormalizedEntropy float64 `json:"normalized_entropy,omitempty"`
	PlantedAUC        float64 `json:"planted_auc,omitempty"`
	// Checkpoints counts the checkpoint attempts.
	Checkpoints Checkpoints `json:"checkpoints"`
	// RefusedGradients counts, by worker ("worker/1"), the gradients the
	// parameter servers' norm guard refused, and NonFiniteGradients those
	// holding NaN or Inf (refused or dropped by --nan-policy): the most
	// any one shard counted, since each judges its own slice.
	RefusedGradients   map[string]int64 `json:"refused_gradients"`
	NonFiniteGradients map[string]int64 `json:"non_finite_gradients"`
	// Divergences are the times the model diverged, in order.
	Divergences []Divergence `json:"divergences"`
	// InitialTestLoss is the test loss of the model training started
	// from, the baseline a divergence and a ruined model are judged
	// against (docs/security.md).
	InitialTestLoss float64 `json:"initial_test_loss"`
	// Suspects are the workers attribution named, in order, and
	// Quarantined those the chief quarantined (docs/security.md,
	// "Attribution"): "worker/1".
	Suspects    []Suspect `json:"suspects"`
	Quarantined []string  `json:"quarantined"`
	// Ruined says why the model handed back is not a success ("": it
	// is): worse than the initial model, or a divergence left
	// unresolved. Such a run exits with status 4.
	Ruined string `json:"ruined,omitempty"`
	// HandedBack says, for a run whose final model was ruined, which
	// model the run handed back instead (docs/semantics.md, "A ruined
	// model is never handed back"); nil otherwise.
	HandedBack *HandedBack `json:"handed_back,omitempty"`
	// MembershipChanges are an elastic run's worker count changes, in
	// order (docs/elastic.md); FinalWorkers the count at the end.
	MembershipChanges []MembershipChange `json:"membership_changes"`
	FinalWorkers      int                `json:"final_workers"`
	// FinalPS is the parameter server count at the end (PS changes are
	// membership changes with role "ps").
	FinalPS int `json:"final_ps"`
	// DataLedger says, by global data epoch, the samples whose gradients
	// the model missed or holds twice where exactly-once per epoch could
	// not hold (docs/recovery.md, "Data positions"); an epoch not listed
	// holds each of its samples once.
	DataLedger []LedgerEntry `json:"data_ledger"`
	// DataQueue is the data queue of an async or ssp run with
	// --data-split queue (nil otherwise).
	DataQueue *DataQueue `json:"data_queue,omitempty"`
	// LiveWorkers are the changes of the number of workers training
	// (heard from within the heartbeat timeout, not quarantined, not
	// removed), in order: a worker that died or froze, came back, was
	// quarantined, added or removed. Empty: all Workers trained
	// throughout.
	LiveWorkers []LiveWorkers   `json:"live_workers"`
	Evals       []Eval          `json:"evals"`
	Restarts    []Restart       `json:"restarts"`
	Tasks       map[string]Task `json:"tasks"`
	BLAS        string          `json:"blas"`
	// TrainStartedUnix is when the first step began (Unix seconds).
	TrainStartedUnix float64 `json:"train_started_unix"`
	// Bottleneck says where the step time went over the whole run and what
	// limited it (nil when the run was too short to sample twice).
	Bottleneck *bottleneck.Breakdown `json:"bottleneck,omitempty"`
	// Stragglers are the workers the launcher's sliding windows counted
	// as slower than the others (bottleneck.StragglerLog); empty when
	// none, null when no launcher watched the run.
	Stragglers []bottleneck.RunStraggler `json:"stragglers"`

	// Wire is what the workers' pushes and pulls carried.
	Wire Wire `json:"wire"`
}

// Wire is the bytes the workers' pushes and pulls put on the wire (their
// payloads: gradients and parameters as sent, after --compress), per
// worker step: the sum over every worker and shard, divided by the steps
// the workers finished (Steps), as their heartbeats last reported them.
type Wire struct {
	Compress         string  `json:"compress"`
	PushBytesPerStep float64 `json:"push_bytes_per_step"`
	PullBytesPerStep float64 `json:"pull_bytes_per_step"`
	Steps            int64   `json:"steps"`
}

// Write stores r as indented JSON, atomically.
func (r *Report) Write(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("report: %w", err)
		}
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o644, atomicfile.Options{}); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// Read loads a report.
func Read(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("report %s: %w", path, err)
	}
	return &r, nil
}
