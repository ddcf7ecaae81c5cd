// Package config holds the run configuration every task of a cluster
// shares. The chief owns the authoritative copy; a task whose copy differs
// is refused at registration with a message naming each differing field.
package config

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/optim"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/transport/compress"
)

// Mode is the SGD variant.
type Mode string

// The SGD modes.
const (
	Sync  Mode = "sync"  // aggregate R gradients per step, drop stale ones
	Async Mode = "async" // apply each gradient on arrival
	SSP   Mode = "ssp"   // async with a bound on how far a worker may run ahead
)

// DataPlane is what carries workers' pulls and pushes.
type DataPlane string

// The data planes.
const (
	GRPC DataPlane = "grpc" // the gRPC API
	TCP  DataPlane = "tcp"  // raw frames beside it (package dataplane)
)

// WireDType is how workers send gradients. Parameters are always pulled
// as f32.
type WireDType string

// The gradient encodings (package wire).
const (
	F32  WireDType = "f32"
	BF16 WireDType = "bf16" // half the bytes, 8 significant bits
)

// Privacy is what the TCP data plane does for its bytes under mutual
// TLS (--tls-dir); without TLS it has no effect.
type Privacy string

// The data plane's privacy modes (package dataplane, docs/security.md).
const (
	// Encrypt: every byte of the data plane goes through TLS
	// (AES-GCM): secret and authenticated.
	Encrypt Privacy = "encrypt"
	// Integrity: the connection is authenticated by the mutual TLS
	// handshake, then its bytes go in the clear, every record tagged
	// with a MAC keyed from the handshake: anyone on the path can read
	// the model and the gradients, no one can change, replay, reorder
	// or move them.
	Integrity Privacy = "integrity"
)

// NaNPolicy is what a PS does with a gradient holding NaN or Inf. Either
// way it is counted and never applied.
type NaNPolicy string

// The NaN policies.
const (
	Reject NaNPolicy = "reject" // refuse the push: the worker stops and says why
	Skip   NaNPolicy = "skip"   // drop it (sync: it counts for the step, left out of the mean); training goes on
)

// DefaultNormGuard is --norm-guard's default multiple: far beyond the
// largest ratio of a gradient's norm to the recent median measured on
// honest runs (docs/security.md, "The divergence guard").
const DefaultNormGuard = 20

// Aggregate is how a sync step combines its gradients.
type Aggregate string

// DataSplit is how an async or ssp run hands its data to the workers
// (docs/elastic.md, "The data queue").
type DataSplit string

const (
	// SplitQueue: every epoch is a queue of chunks of a few batches,
	// handed to each worker as it reads, so a slower worker reads less
	// of each epoch and no epoch waits for it.
	SplitQueue DataSplit = "queue"
	// SplitFixed: a shard of every epoch per worker, whatever the
	// speeds (sync runs always).
	SplitFixed DataSplit = "fixed"
)

// The aggregation rules.
const (
	Mean        Aggregate = "mean"         // the mean of the step's gradients
	TrimmedMean Aggregate = "trimmed-mean" // per coordinate, the mean without the largest and the smallest value (3 or more gradients)
)

// Run is the configuration of one training run. Fields tagged
// `check:"-"` are local to a task and excluded from the registration
// comparison.
type Run struct {
	Mode                Mode `json:"mode"`
	Staleness           int  `json:"staleness"`
	ReplicasToAggregate int  `json:"replicas_to_aggregate"` // 0: all workers
	PS                  int  `json:"ps"`
	// PSReplicas is the hot standbys per shard (--ps-replicas): 0, or 1
	// (standby/N beside every ps/N; docs/replication.md).
	PSReplicas int `json:"ps_replicas,omitempty"`
	Workers    int `json:"workers"`
	// DataSplit is how an async or ssp run hands its data to the
	// workers (--data-split): SplitQueue or SplitFixed ("", as in
	// configurations written before the queue: fixed; sync runs: always
	// fixed). The chief alone decides it.
	DataSplit DataSplit `json:"data_split,omitempty" check:"-"`
	// MaxWorkers bounds the workers an elastic run may scale to
	// (docs/elastic.md): `pstrain scale`, or a worker registering with
	// the next index. 0: WorkerSlots' default.
	MaxWorkers int `json:"max_workers,omitempty"`
	// MaxPS bounds the parameter servers a run may scale to
	// (docs/elastic.md, "Parameter servers"): the cluster lists that
	// many PS slots. 0: PSSlots' default, --ps (no room to grow).
	MaxPS int `json:"max_ps,omitempty"`
	// Model is the network's kind: empty for an MLP (so an MLP's
	// configuration is what it was before CNNs existed), model.KindCNN or
	// model.KindCTR.
	Model ModelKind `json:"model,omitempty"`
	// EmbeddingDim is a CTR model's values per embedding row
	// (--embedding-dim; 0 for other models).
	EmbeddingDim int `json:"embedding_dim,omitempty"`
	// EmbeddingOptimizer and EmbeddingLR are the rule a CTR model's rows
	// train with (embed.Rule: adagrad, sgd or momentum, the latter with
	// Momentum); empty and 0 for other models.
	EmbeddingOptimizer string  `json:"embedding_optimizer,omitempty"`
	EmbeddingLR        float64 `json:"embedding_lr,omitempty"`
	// EmbeddingPrefill is the rows each of a CTR model's tables starts
	// with, of keys no data uses (--embedding-prefill; embed.PrefillKey):
	// tables of a given size that train as the data alone trains them.
	// The chief sends it in the shards' Init (TableSpec.prefill_rows).
	EmbeddingPrefill int64 `json:"embedding_prefill,omitempty"`
	// Conv is the output channels of each CNN convolution (--model cnn;
	// empty for an MLP).
	Conv           []int   `json:"conv,omitempty"`
	Hidden         []int   `json:"hidden"`
	Batch          int     `json:"batch"`
	LR             float64 `json:"lr"`
	Momentum       float64 `json:"momentum"`
	Optimizer      string  `json:"optimizer"`
	Epochs         float64 `json:"epochs"`
	TargetAccuracy float64 `json:"target_accuracy"`
	Dataset        string  `json:"dataset"`
	DataFraction   float64 `json:"data_fraction"`
	Seed           int64   `json:"seed"`
	// NaNPolicy is what a PS does with a gradient holding NaN or Inf:
	// Reject refuses the push with an error (the worker stops and says
	// why), Skip drops it and training goes on. Either way it is counted
	// and never applied.
	NaNPolicy NaNPolicy `json:"nan_policy"`
	// NormGuard is the divergence guard's multiple K: a PS refuses a
	// gradient whose L2 norm (of its shard's slice) is more than K times
	// the median of the shard's recent accepted norms (package ps,
	// NormGuard; docs/security.md). 0 turns the refusals off.
	NormGuard float64 `json:"norm_guard,omitempty"`
	// Aggregate is how a sync step combines its gradients: Mean, or
	// TrimmedMean (sync only). Empty (a run written before it existed)
	// is Mean.
	Aggregate Aggregate `json:"aggregate,omitempty"`
	// DataPlane carries pulls and pushes: GRPC or TCP (raw frames;
	// package dataplane).
	DataPlane DataPlane `json:"data_plane"`
	// WireDType is how workers send gradients: F32, or BF16 (half the
	// bytes, 8 significant bits; package wire). Parameters are always
	// pulled as f32.
	WireDType WireDType `json:"wire_dtype"`
	// DataPlanePrivacy is what the TCP data plane does for its bytes
	// under mutual TLS: Encrypt, or Integrity (authenticated but not
	// secret; docs/security.md). Empty (a run written before it
	// existed) is Encrypt.
	DataPlanePrivacy Privacy `json:"data_plane_privacy,omitempty"`
	// Compress is how pushes and pulls are compressed, with error
	// feedback: none (or empty), topk:FRACTION, int8 or sign for both,
	// or PUSH/PULL, a codec for each (package compress; docs/wire.md,
	// "Compression").
	Compress string `json:"compress,omitempty"`
	// LRSchedule is the learning rate's schedule over the global step
	// (the shards' version): "constant", "step:EPOCHS:FACTOR" or "cosine"
	// (optim.ParseSchedule). The shards compute it, so they all agree.
	LRSchedule string `json:"lr_schedule"`
	// WarmupSteps ramps the rate up linearly over the first global steps
	// (0: none).
	WarmupSteps int64 `json:"warmup_steps"`

	DataDir          string        `json:"data_dir" check:"-"`
	EvalEvery        time.Duration `json:"eval_every" check:"-"`
	HeartbeatTimeout time.Duration `json:"heartbeat_timeout" check:"-"`

	// CheckpointDir is where checkpoints go ("" = none). Every PS writes
	// its shard there and the chief commits the manifest, so it must be
	// the same directory (a shared file system) for all of them.
	CheckpointDir   string `json:"checkpoint_dir" check:"-"`
	CheckpointEvery Every  `json:"checkpoint_every" check:"-"`
	KeepCheckpoints int    `json:"keep_checkpoints" check:"-"`
	// CheckpointMode is the permission of the checkpoint directories the
	// tasks make (files get the same without execute bits): 0700 (and
	// 0600) by default, wider for a volume shared by several users
	// (--checkpoint-mode 0750: directories 0750, files 0640).
	CheckpointMode FileMode `json:"checkpoint_mode,omitempty" check:"-"`
	// KeepArchives is how many archives of earlier runs' checkpoints
	// (CheckpointDir/archive-<time>/, made when a new run starts) are
	// kept: the oldest beyond it are deleted (0: none kept, -1: all).
	KeepArchives int `json:"keep_archives,omitempty" check:"-"`
	// Resume: the chief starts from the newest valid checkpoint in
	// CheckpointDir if there is one for this model.
	Resume bool `json:"resume" check:"-"`
	// TargetHold is how many evaluations in a row must score at least
	// TargetAccuracy on the whole test set before the run stops; the
	// model handed back is the last of them (docs/semantics.md).
	TargetHold int `json:"target_hold" check:"-"`
	// Patience stops a run once this many evaluations in a row scored a
	// test loss no lower than the model's best so far (0: never; a CTR
	// model's default is DefaultCTRPatience). The model handed back is
	// the best one evaluated, restored from its checkpoint
	// (docs/semantics.md, "Stopped by plateau").
	Patience int `json:"patience,omitempty" check:"-"`
}

// ModelKind is a run's model kind: "" (an MLP, also written "mlp") or
// model.KindCNN.
type ModelKind string

// IsCNN says whether the run trains a CNN.
func (k ModelKind) IsCNN() bool { return k == model.KindCNN }

// IsCTR says whether the run trains a click-through-rate model.
func (k ModelKind) IsCTR() bool { return k == model.KindCTR }

// String is the kind's name: "mlp" or "cnn".
func (k ModelKind) String() string {
	if k == "" {
		return model.KindMLP
	}
	return string(k)
}

// Every is a checkpoint interval: a duration ("30s") or a number of
// global steps ("500" or "500steps"). The zero value means only at the
// end of training.
type Every struct {
	Duration time.Duration
	Steps    int64
}

// IsZero reports whether no interval is set.
func (e Every) IsZero() bool { return e.Duration == 0 && e.Steps == 0 }

// String renders e the way ParseEvery reads it.
func (e Every) String() string {
	switch {
	case e.Steps > 0:
		return strconv.FormatInt(e.Steps, 10) + "steps"
	case e.Duration > 0:
		return e.Duration.String()
	}
	return "0"
}

// ParseEvery reads "30s", "2m", "500" or "500steps"; "0" is the zero
// interval.
func ParseEvery(s string) (Every, error) {
	t := strings.TrimSuffix(strings.TrimSpace(s), "steps")
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n < 0 {
			return Every{}, fmt.Errorf("checkpoint interval %q is negative", s)
		}
		return Every{Steps: n}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return Every{}, fmt.Errorf("checkpoint interval %q: want a duration (30s) or a number of steps (500)", s)
	}
	return Every{Duration: d}, nil
}

// MarshalText encodes e as its String.
func (e Every) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// UnmarshalText decodes what MarshalText wrote.
func (e *Every) UnmarshalText(b []byte) error {
	v, err := ParseEvery(string(b))
	if err != nil {
		return err
	}
	*e = v
	return nil
}

// Default is the default run: the `make run` cluster.
func Default() Run {
	return Run{
		Mode:             Sync,
		Staleness:        3,
		DataSplit:        SplitQueue,
		PS:               2,
		Workers:          2,
		Hidden:           []int{800},
		Batch:            128,
		LR:               DefaultMLPLR,
		Momentum:         0.9,
		Optimizer:        "momentum",
		LRSchedule:       "step:2:0.3",
		Epochs:           10,
		TargetAccuracy:   0.975,
		TargetHold:       3,
		Dataset:          "mnist",
		DataFraction:     1,
		Seed:             1,
		NaNPolicy:        Reject,
		NormGuard:        DefaultNormGuard,
		Aggregate:        Mean,
		DataPlane:        TCP,
		WireDType:        F32,
		DataPlanePrivacy: Encrypt,
		Compress:         string(compress.None),
		DataDir:          "data",
		EvalEvery:        time.Second,
		HeartbeatTimeout: 3 * time.Second,
		CheckpointEvery:  Every{Duration: 10 * time.Second},
		KeepCheckpoints:  3,
		CheckpointMode:   0o700,
		KeepArchives:     2,
		Resume:           true,
	}
}

// Validate reports the first impossible value, phrased for a user.
func (r Run) Validate() error {
	for _, check := range []func() error{r.validateShape, r.validateTraining, r.validateTiming,
		r.validateCheckpoints, r.validateRobustness, r.validateChoices, r.validateModel} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateShape checks the mode and the cluster's shape: its shards,
// standbys and workers.
func (r Run) validateShape() error {
	if err := oneOf("--mode", r.Mode, Sync, Async, SSP); err != nil {
		return err
	}
	switch {
	case r.PS < 1:
		return fmt.Errorf("--ps must be at least 1, got %d", r.PS)
	case r.PS > partition.MaxShards || r.MaxPS > partition.MaxShards:
		return fmt.Errorf("--ps and --max-ps must be at most %d (a model's partition has no more shards), got %d and %d", partition.MaxShards, r.PS, r.MaxPS)
	case r.PSReplicas < 0 || r.PSReplicas > 1:
		return fmt.Errorf("--ps-replicas must be 0 (no hot standbys) or 1 (a standby process per shard), got %d", r.PSReplicas)
	case r.MaxPS != 0 && r.MaxPS < r.PS:
		return fmt.Errorf("--max-ps %d is less than --ps %d (0 = --ps)", r.MaxPS, r.PS)
	case r.Staleness < 0:
		return fmt.Errorf("--staleness must be >= 0, got %d", r.Staleness)
	}
	return r.validateWorkers()
}

// validateWorkers checks the workers, the slots an elastic run may scale
// to and the gradients a sync step aggregates.
func (r Run) validateWorkers() error {
	switch {
	case r.Workers < 1:
		return fmt.Errorf("--workers must be at least 1, got %d", r.Workers)
	case r.Workers > MaxWorkerSlots:
		return fmt.Errorf("--workers must be at most %d, got %d", MaxWorkerSlots, r.Workers)
	case r.MaxWorkers < 0 || r.MaxWorkers > MaxWorkerSlots:
		return fmt.Errorf("--max-workers must be in [0, %d] (0 = the default, %d), got %d", MaxWorkerSlots, max(r.Workers, 8), r.MaxWorkers)
	case r.MaxWorkers != 0 && r.MaxWorkers < r.Workers:
		return fmt.Errorf("--max-workers %d is less than --workers %d (0 = the default, %d)", r.MaxWorkers, r.Workers, max(r.Workers, 8))
	case r.ReplicasToAggregate < 0:
		return fmt.Errorf("--replicas-to-aggregate must be >= 0 (0 means all workers), got %d", r.ReplicasToAggregate)
	case r.ReplicasToAggregate > r.Workers:
		return fmt.Errorf("--replicas-to-aggregate %d is more than --workers %d: a step could never complete", r.ReplicasToAggregate, r.Workers)
	}
	return nil
}

// validateTraining checks the optimisation and the data: batch, learning
// rate, momentum, warmup, epochs, the target and the data fraction.
func (r Run) validateTraining() error {
	switch {
	case r.Batch < 1:
		return fmt.Errorf("--batch must be at least 1, got %d", r.Batch)
	case !(r.LR > 0) || math.IsInf(r.LR, 0):
		return fmt.Errorf("--lr must be a positive number, got %v", r.LR)
	case !(r.Momentum >= 0 && r.Momentum < 1): // NaN too
		return fmt.Errorf("--momentum must be in [0, 1), got %v", r.Momentum)
	case r.WarmupSteps < 0:
		return fmt.Errorf("--warmup-steps must be >= 0 (0 = no warmup), got %d", r.WarmupSteps)
	case !(r.Epochs > 0):
		return fmt.Errorf("--epochs must be positive, got %v", r.Epochs)
	case r.TargetAccuracy < 0 || r.TargetAccuracy > 1:
		return fmt.Errorf("--target-accuracy must be in [0, 1] (0 = run all epochs), got %v", r.TargetAccuracy)
	case r.TargetHold < 0:
		return fmt.Errorf("--target-hold must be >= 1 (evaluations in a row at the target), got %d", r.TargetHold)
	case r.Patience < 0:
		return fmt.Errorf("--patience must be >= 0 (evaluations in a row without a lower test loss; 0 = never stop on that), got %d", r.Patience)
	case !(r.DataFraction > 0) || r.DataFraction > 1:
		return fmt.Errorf("--data-fraction must be in (0, 1], got %v", r.DataFraction)
	}
	return nil
}

// validateTiming checks the evaluation and heartbeat intervals.
func (r Run) validateTiming() error {
	switch {
	case r.EvalEvery < 0:
		return fmt.Errorf("--eval-every must not be negative, got %v", r.EvalEvery)
	case r.HeartbeatTimeout <= 0:
		return fmt.Errorf("--heartbeat-timeout must be positive, got %v", r.HeartbeatTimeout)
	}
	return nil
}

// validateCheckpoints checks the checkpoints' permissions and retention.
func (r Run) validateCheckpoints() error {
	switch {
	case r.CheckpointMode != 0 && (r.CheckpointMode&0o700 != 0o700 || r.CheckpointMode&^0o777 != 0):
		return fmt.Errorf("--checkpoint-mode must be an octal permission from 0700 to 0777 that lets the owner in (rwx), got %04o", uint32(r.CheckpointMode))
	case r.KeepCheckpoints < 0:
		return fmt.Errorf("--keep-checkpoints must be >= 0 (0 keeps all), got %d", r.KeepCheckpoints)
	case r.KeepArchives < -1:
		return fmt.Errorf("--keep-archives must be >= -1 (0 keeps none, -1 all), got %d", r.KeepArchives)
	}
	return nil
}

// validateRobustness checks the defences against faulty gradients: the
// norm guard and the aggregation rule.
func (r Run) validateRobustness() error {
	switch {
	case !(r.NormGuard == 0 || r.NormGuard >= 2) || math.IsInf(r.NormGuard, 0):
		return fmt.Errorf("--norm-guard must be 0 (off) or a multiple of at least 2, got %v", r.NormGuard)
	case r.Aggregate != "" && oneOf("--aggregate", r.Aggregate, Mean, TrimmedMean) != nil:
		return oneOf("--aggregate", r.Aggregate, Mean, TrimmedMean)
	case r.Aggregate == TrimmedMean && r.Mode != Sync:
		return fmt.Errorf("--aggregate %s combines the gradients of a sync step: it needs --mode sync, got %s", r.Aggregate, r.Mode)
	}
	return nil
}

// validateChoices checks the flags that name one of a few choices, and
// the learning-rate schedule.
func (r Run) validateChoices() error {
	for _, err := range []error{
		oneOf("--data-plane", r.DataPlane, GRPC, TCP),
		oneOf("--wire-dtype", r.WireDType, F32, BF16),
		oneOf("--data-plane-privacy", cmp.Or(r.DataPlanePrivacy, Encrypt), Encrypt, Integrity), // "": an earlier run's, Encrypt
		oneOf("--nan-policy", r.NaNPolicy, Reject, Skip),
		oneOf("--optimizer", r.Optimizer, "sgd", "momentum", "adam"),                   // optim.New's names
		oneOf("--data-split", cmp.Or(r.DataSplit, SplitFixed), SplitQueue, SplitFixed), // "": an earlier run's, fixed
	} {
		if err != nil {
			return err
		}
	}
	if err := r.validateCompress(); err != nil {
		return err
	}
	_, err := r.Schedule()
	return err
}

// validateCompress checks --compress, and that it is not combined with
// another encoding of the gradients.
func (r Run) validateCompress() error {
	sp, err := compress.ParseSetting(r.Compress)
	switch {
	case err != nil:
		return fmt.Errorf("--compress %w", err)
	case !sp.Off() && r.WireDType == BF16:
		return fmt.Errorf("--compress %s encodes the gradients itself: it needs --wire-dtype f32, got %s", sp, r.WireDType)
	}
	return nil
}

// CompressSetting is --compress parsed (none if it does not parse:
// Validate says why).
func (r Run) CompressSetting() compress.Setting {
	sp, err := compress.ParseSetting(r.Compress)
	if err != nil {
		return compress.Setting{Push: compress.Spec{Kind: compress.None}, Pull: compress.Spec{Kind: compress.None}}
	}
	return sp
}

// validateModel checks the network: the MLP's hidden layers, the kind,
// a CNN's convolutions and a CTR model's embeddings.
func (r Run) validateModel() error {
	for i, h := range r.Hidden {
		if h <= 0 {
			return fmt.Errorf("--hidden: layer %d has size %d; sizes must be positive", i, h)
		}
	}
	if err := oneOf("--model", r.Model, "", model.KindMLP, model.KindCNN, model.KindCTR); err != nil {
		return oneOf("--model", r.Model, model.KindMLP, model.KindCNN, model.KindCTR) // the names a user can type
	}
	if err := r.validateCTR(); err != nil {
		return err
	}
	if !r.Model.IsCNN() && len(r.Conv) > 0 {
		return fmt.Errorf("--conv sets a CNN's convolutions: it needs --model cnn")
	}
	if r.Model.IsCNN() && len(r.Conv) == 0 {
		return fmt.Errorf("--model cnn needs at least one convolution (--conv, e.g. 16,32)")
	}
	for i, c := range r.Conv {
		if c <= 0 {
			return fmt.Errorf("--conv: convolution %d has %d channels; counts must be positive", i, c)
		}
	}
	return nil
}

// validateCTR checks a CTR model's embeddings and data set, and that
// other models have neither.
func (r Run) validateCTR() error {
	if !r.Model.IsCTR() {
		switch {
		case r.EmbeddingDim != 0 || r.EmbeddingOptimizer != "" || r.EmbeddingLR != 0 || r.EmbeddingPrefill != 0:
			return fmt.Errorf("--embedding-dim, --embedding-optimizer, --embedding-lr and --embedding-prefill set a CTR model's tables: they need --model ctr")
		case ctrdata.IsName(r.Dataset):
			return fmt.Errorf("--dataset %s is click-through-rate data: it needs --model ctr", r.Dataset)
		}
		return nil
	}
	switch {
	case r.EmbeddingDim < 1 || r.EmbeddingDim > MaxEmbeddingDim:
		return fmt.Errorf("--embedding-dim must be from 1 to %d, got %d", MaxEmbeddingDim, r.EmbeddingDim)
	case r.EmbeddingPrefill < 0 || r.EmbeddingPrefill > embed.MaxPrefill:
		return fmt.Errorf("--embedding-prefill must be from 0 to %d rows a table, got %d", embed.MaxPrefill, r.EmbeddingPrefill)
	case len(r.Conv) > 0:
		return fmt.Errorf("--conv sets a CNN's convolutions: --model ctr has none")
	case !ctrdata.IsName(r.Dataset):
		return fmt.Errorf("--model ctr reads click-through-rate data: --dataset %s or %sPATH, got %q", ctrdata.SynthName, ctrdata.CriteoPrefix, r.Dataset)
	}
	if err := oneOf("--embedding-optimizer", r.EmbeddingOptimizer, string(embed.Adagrad), string(embed.SGD), string(embed.Momentum)); err != nil {
		return err
	}
	if err := r.EmbeddingRule().Validate(); err != nil {
		return fmt.Errorf("--embedding-lr must be a positive number, got %v", r.EmbeddingLR)
	}
	return nil
}

// MaxEmbeddingDim bounds --embedding-dim: a table's largest dimension
// (embed.MaxDim).
const MaxEmbeddingDim = embed.MaxDim

// DefaultCTRHidden is a CTR model's dense layers when --hidden is not
// given (docs/models.md, "The CTR model").
var DefaultCTRHidden = []int{128, 64}

// A CTR model's settings when not given: the embedding rows' dimension
// and rule, and the dense layers' learning rate (with the default
// momentum optimizer), measured on the default synthetic set in one
// process (docs/models.md).
const (
	DefaultEmbeddingDim       = 16
	DefaultEmbeddingOptimizer = string(embed.Adagrad)
	DefaultEmbeddingLR        = 2.0
	DefaultCTRLR              = 0.05
	// DefaultCTREpochs: a CTR run stops by epochs (no accuracy target),
	// and on the default synthetic set the held-out AUC peaks after 2-3
	// epochs, then falls as the rows overfit the keys seen few times.
	DefaultCTREpochs = 2.0
	// DefaultCTRPatience: so that a run given more epochs stops near
	// that peak rather than handing back the overfit model of its last
	// epoch.
	DefaultCTRPatience = 3
)

// EmbeddingRule is the rule a CTR model's rows train with.
func (r Run) EmbeddingRule() embed.Rule {
	lr := float32(r.EmbeddingLR)
	switch embed.Kind(r.EmbeddingOptimizer) {
	case embed.Adagrad:
		return embed.DefaultAdagrad(lr)
	case embed.Momentum:
		return embed.Rule{Kind: embed.Momentum, LR: lr, Momentum: float32(r.Momentum)}
	}
	return embed.Rule{Kind: embed.Kind(r.EmbeddingOptimizer), LR: lr}
}

// CTRSpec is the CTR model the run trains on data of dense dense fields
// and fields categorical ones (ctrdata.Schema).
func (r Run) CTRSpec(dense, fields int) model.Spec {
	return model.Spec{Kind: model.KindCTR, Input: dense, Fields: fields, EmbeddingDim: r.EmbeddingDim,
		Hidden: append([]int(nil), r.Hidden...), Classes: 1}
}

// oneOf says, phrased for a user, that flag's value got is none of want
// ("--mode must be sync, async or ssp, got \"bsp\""), or returns nil.
func oneOf[T ~string](flag string, got T, want ...T) error {
	if slices.Contains(want, got) {
		return nil
	}
	names := make([]string, len(want))
	for i, w := range want {
		names[i] = string(w)
	}
	list := names[len(names)-1]
	if len(names) > 1 {
		list = strings.Join(names[:len(names)-1], ", ") + " or " + list
	}
	return fmt.Errorf("%s must be %s, got %q", flag, list, string(got))
}

// Schedule is the parsed --lr-schedule.
func (r Run) Schedule() (optim.Schedule, error) {
	s, err := optim.ParseSchedule(r.LRSchedule)
	if err != nil {
		return s, fmt.Errorf("--lr-schedule %w", err)
	}
	return s, nil
}

// Standbys is the number of standby processes the run has: one per
// shard with --ps-replicas 1, else none.
func (r Run) Standbys() int { return r.PS * r.PSReplicas }

// StandbySlots is the number of standby slots: one beside every PS slot
// (--max-ps) with --ps-replicas 1, else none.
func (r Run) StandbySlots() int { return r.PSSlots() * r.PSReplicas }

// Replicas is the number of gradients a sync step aggregates when all
// workers are alive.
func (r Run) Replicas() int {
	if r.ReplicasToAggregate == 0 {
		return r.Workers
	}
	return r.ReplicasToAggregate
}

// The CNN's sizes when --conv and --hidden are not given
// (docs/models.md: the smallest of those measured that reaches 99% on
// MNIST).
var (
	DefaultCNNConv   = []int{16, 32}
	DefaultCNNHidden = []int{256}
)

// The CNN's per-worker batch, learning rate and warmup when --batch, --lr
// and --warmup-steps are not given (docs/semantics.md, "Default learning
// rates"). With the default 2 workers a sync step is then the mean
// gradient of 128 images at 0.05, the single-process recipe that holds
// 99% in 2.3-2.4 epochs; at the general batch of 128 a sync step took 256
// images, half the updates an epoch, and held 99% only after 4 or more
// epochs. 0.05 without warmup blew the loss up once in the first 20 steps.
const (
	DefaultCNNBatch       = 64
	DefaultCNNLR          = 0.05
	DefaultCNNWarmupSteps = 200
)

// DefaultMLPLR is an MLP's learning rate when --lr is not given, for a
// sync step (see DefaultLR).
const DefaultMLPLR = 0.2

// DefaultLR is the learning rate a run of the model kind, mode and
// workers gets when --lr is not given (docs/semantics.md, "Default
// learning rates"). The model's rate (DefaultMLPLR, DefaultCNNLR,
// DefaultCTRLR) is for a sync step, which applies the mean of every
// worker's gradient; in async and ssp each worker's gradient is an update
// of its own, so the rate is divided by the workers: an epoch then moves
// the weights as far as a sync epoch does, and the staleness that grows
// with the workers meets a smaller step (the full rate per update
// overshot: async ended below its target, the MLP at 0.2 and the CNN at
// 0.05).
func DefaultLR(kind ModelKind, mode Mode, workers int) float64 {
	lr := DefaultMLPLR
	switch {
	case kind.IsCNN():
		lr = DefaultCNNLR
	case kind.IsCTR():
		lr = DefaultCTRLR
	}
	if mode == Sync {
		return lr
	}
	return lr / float64(max(1, workers))
}

// MaxWorkerSlots bounds --workers and --max-workers, and the workers a
// shard's options may name: a shard keeps a few words of state per
// worker slot, so the bound keeps an init of garbage from asking a PS
// for gigabytes.
const MaxWorkerSlots = 4096

// WorkerSlots is the most workers the run may have at once
// (--max-workers; 0: at least 8, and never fewer than --workers).
func (r Run) WorkerSlots() int {
	if r.MaxWorkers > 0 {
		return r.MaxWorkers
	}
	return max(r.Workers, 8)
}

// PSSlots is the most parameter servers the run may have at once
// (--max-ps; 0: --ps).
func (r Run) PSSlots() int {
	return max(r.MaxPS, r.PS)
}

// ReplicasFor is the number of gradients a sync step aggregates with
// workers workers: all of them, or as many fewer as the run's backup
// workers (--replicas-to-aggregate below --workers), at least one.
func (r Run) ReplicasFor(workers int) int {
	if r.ReplicasToAggregate == 0 {
		return workers
	}
	return max(1, workers-(r.Workers-r.ReplicasToAggregate))
}

// Spec is the model the run trains on data with the given input size and
// number of classes. A CNN reads the input as a square single-channel
// image; on data that is not square its spec fails Validate.
func (r Run) Spec(input, classes int) model.Spec {
	s := model.Spec{Input: input, Hidden: append([]int(nil), r.Hidden...), Classes: classes}
	if r.Model.IsCNN() {
		side := model.ImageSide(input)
		s.Kind, s.Height, s.Width, s.Conv = model.KindCNN, side, side, append([]int(nil), r.Conv...)
	}
	return s
}

// JSON encodes the configuration.
func (r Run) JSON() []byte {
	b, _ := json.Marshal(r) // plain values only: cannot fail
	return b
}

// Parse decodes a configuration from JSON.
func Parse(b []byte) (Run, error) {
	var r Run
	if err := json.Unmarshal(b, &r); err != nil {
		return Run{}, fmt.Errorf("run configuration: %w", err)
	}
	if r.LRSchedule == "" {
		r.LRSchedule = "constant" // written before schedules existed
	}
	if r.Model == model.KindMLP {
		r.Model = "" // an MLP's canonical form
	}

	return r, nil
}

// Diff lists the settings (Settings) on which other differs from r, as
// "name: r's (chief) vs other's (this task)".
func (r Run) Diff(other Run) []string { return DiffSettings(r.Settings(), other.Settings()) }

// Setting is one value of a run configuration that every task of the run
// must share, named as in the configuration's JSON and written with
// fmt's %v (RegisterRequest.settings).
type Setting struct{ Name, Value string }

// Settings are r's values that every task must share: its fields but
// those tagged check:"-" (paths, periods, checkpoint and evaluation
// settings), in field order.
func (r Run) Settings() []Setting {
	var out []Setting
	v := reflect.ValueOf(r)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Tag.Get("check") == "-" {
			continue
		}
		name := strings.Split(f.Tag.Get("json"), ",")[0]
		out = append(out, Setting{Name: name, Value: fmt.Sprint(v.Field(i).Interface())})
	}
	return out
}

// DiffSettings lists the settings on which theirs (a task's) differs from
// mine (the chief's): a different value, one missing, or one the chief
// does not know.
func DiffSettings(mine, theirs []Setting) []string {
	have := make(map[string]string, len(theirs))
	for _, s := range theirs {
		have[s.Name] = s.Value
	}
	var out []string
	for _, s := range mine {
		v, ok := have[s.Name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: %s (chief) vs none (this task)", s.Name, s.Value))
		case v != s.Value:
			out = append(out, fmt.Sprintf("%s: %s (chief) vs %s (this task)", s.Name, s.Value, v))
		}
		delete(have, s.Name)
	}
	for _, s := range theirs {
		if _, ok := have[s.Name]; ok {
			out = append(out, fmt.Sprintf("%s: unknown to the chief (this task: %s)", s.Name, s.Value))
		}
	}
	return out
}

// FileMode is a permission given in octal on the command line ("0750").
type FileMode uint32

// String is the mode in octal with a leading zero.
func (m FileMode) String() string { return fmt.Sprintf("%04o", uint32(m)) }

// MarshalText writes the mode in octal.
func (m FileMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText reads an octal mode ("0750" or "750").
func (m *FileMode) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 8, 32)
	if err != nil {
		return fmt.Errorf("not an octal permission: %q", b)
	}
	*m = FileMode(v)
	return nil
}
