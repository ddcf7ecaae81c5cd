package ps

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/compress"
)

// Options are what a shard needs of the run configuration, and all of it
// a shard receives: the chief builds them with OptionsFor and sends them
// as InitRequest.shard_options (Proto). The run's length (max_version,
// steps_per_epoch) travels in the request beside them; the rest of the
// run configuration (data, model size, checkpoint and evaluation
// settings...) is no business of a shard's.
type Options struct {
	Mode config.Mode
	// Replicas is how many gradients a sync step aggregates while every
	// worker lives: the run's replicas to aggregate resolved
	// (config.Run.Replicas), never 0.
	Replicas  int
	Staleness int // ssp: how far a worker may run ahead
	Workers   int // worker indices are 0..Workers-1
	// Optimizer is optim.New's name (sgd, momentum or adam); it also names
	// the optimizer state's tensors in the shard's checkpoint files.
	Optimizer   string
	LR          float64
	Momentum    float64
	LRSchedule  string // optim.ParseSchedule
	WarmupSteps int64
	// NaNPolicy: a push holding NaN or Inf is refused, or dropped.
	NaNPolicy config.NaNPolicy
	// WireDType is how the workers' pushes encode gradients.
	WireDType config.WireDType
	// Compress is how the workers' pushes and the shard's answers to
	// their pulls are compressed (a push codec of compress.None: pushes
	// are not; then WireDType says how they are encoded).
	Compress compress.Setting
	// NormGuard is the divergence guard's multiple (0: off).
	NormGuard float64
	// Aggregate is how a sync step combines its gradients.
	Aggregate config.Aggregate
	// LRFactor scales the learning rate and its schedule: the chief
	// lowers it after rolling a diverged model back (0 means 1).
	LRFactor float64
}

// OptionsFor is the part of the run configuration r a shard needs.
func OptionsFor(r config.Run) Options {
	return Options{Mode: r.Mode, Replicas: r.Replicas(), Staleness: r.Staleness, Workers: r.Workers,
		Optimizer: r.Optimizer, LR: r.LR, Momentum: r.Momentum, LRSchedule: r.LRSchedule, WarmupSteps: r.WarmupSteps,
		NaNPolicy: r.NaNPolicy, WireDType: r.WireDType, NormGuard: r.NormGuard, Aggregate: r.Aggregate,
		Compress: r.CompressSetting()}
}

// Rate is the learning rate the shard applies: LR times LRFactor.
func (o Options) Rate() float64 {
	if o.LRFactor == 0 {
		return o.LR
	}
	return o.LR * o.LRFactor
}

// Validate reports the first value a shard cannot work with. The messages
// name the options' fields (as in InitRequest.shard_options), not the
// command line's flags: a shard knows its options, not how a run was
// launched.
func (o Options) Validate() error {
	if err := o.validateNumbers(); err != nil {
		return err
	}
	for _, err := range []error{
		oneOf("mode", o.Mode, config.Sync, config.Async, config.SSP),
		oneOf("optimizer", o.Optimizer, "sgd", "momentum", "adam"), // optim.New's names
		oneOf("nan_policy", o.NaNPolicy, config.Reject, config.Skip),
		oneOf("wire_dtype", o.WireDType, config.F32, config.BF16),
		oneOf("aggregate", o.Aggregate, "", config.Mean, config.TrimmedMean),
	} {
		if err != nil {
			return err
		}
	}
	if _, err := compress.ParseSetting(o.Compress.String()); err != nil || (!o.Compress.Off() && o.WireDType != config.F32) {
		return fmt.Errorf("compress must be none, or topk:FRACTION, int8 or sign (or PUSH/PULL of them) with wire_dtype f32, got %q with wire_dtype %q", o.Compress, o.WireDType)
	}
	if o.Aggregate == config.TrimmedMean && o.Mode != config.Sync {
		return fmt.Errorf("aggregate %s combines the gradients of a sync step: it needs mode sync, got %s", o.Aggregate, o.Mode)
	}
	if _, err := optim.ParseSchedule(o.LRSchedule); err != nil {
		return fmt.Errorf("lr_schedule %w", err)
	}
	return nil
}

// validateNumbers checks the options' numeric ranges.
func (o Options) validateNumbers() error {
	if err := o.validateCounts(); err != nil {
		return err
	}
	switch {
	case !(o.LR > 0) || math.IsInf(o.LR, 0):
		return fmt.Errorf("lr must be a positive number, got %v", o.LR)
	case !(o.Momentum >= 0 && o.Momentum < 1): // NaN too
		return fmt.Errorf("momentum must be in [0, 1), got %v", o.Momentum)
	case o.WarmupSteps < 0:
		return fmt.Errorf("warmup_steps must be >= 0, got %d", o.WarmupSteps)
	case !(o.NormGuard == 0 || o.NormGuard >= 2) || math.IsInf(o.NormGuard, 0):
		return fmt.Errorf("norm_guard must be 0 (off) or a multiple of at least 2, got %v", o.NormGuard)
	case !(o.LRFactor >= 0 && o.LRFactor <= 1):
		return fmt.Errorf("lr_factor (the chief's learning-rate factor after a rollback) must be in (0, 1], got %v", o.LRFactor)
	}
	return nil
}

// validateCounts checks the workers, the gradients a sync step
// aggregates and the staleness bound.
func (o Options) validateCounts() error {
	switch {
	case o.Workers < 1 || o.Workers > config.MaxWorkerSlots:
		return fmt.Errorf("workers must be in [1, %d], got %d", config.MaxWorkerSlots, o.Workers)
	case o.Replicas < 1 || o.Replicas > o.Workers:
		return fmt.Errorf("replicas (gradients per sync step) must be in [1, workers %d], got %d", o.Workers, o.Replicas)
	case o.Staleness < 0:
		return fmt.Errorf("staleness must be >= 0, got %d", o.Staleness)
	}
	return nil
}

// oneOf reports a value of field that is none of want.
func oneOf[T ~string](field string, got T, want ...T) error {
	if slices.Contains(want, got) {
		return nil
	}
	return fmt.Errorf("%s must be one of %q, got %q", field, want, got)
}

// Proto is the options as InitRequest.shard_options.
func (o Options) Proto() *pb.ShardOptions {
	return &pb.ShardOptions{Mode: string(o.Mode), Replicas: int32(o.Replicas), Staleness: int32(o.Staleness),
		Workers: int32(o.Workers), Optimizer: o.Optimizer, Lr: o.LR, Momentum: o.Momentum, LrSchedule: o.LRSchedule,
		WarmupSteps: o.WarmupSteps, NanPolicy: string(o.NaNPolicy), WireDtype: string(o.WireDType),
		NormGuard: o.NormGuard, Aggregate: string(o.Aggregate), LrFactor: o.LRFactor, Compress: o.Compress.String()}
}

// OptionsFromProto reads and validates InitRequest.shard_options.
func OptionsFromProto(m *pb.ShardOptions) (Options, error) {
	if m == nil {
		return Options{}, errors.New("shard options: none in the init request (a chief older than this PS?)")
	}
	o := Options{Mode: config.Mode(m.Mode), Replicas: int(m.Replicas), Staleness: int(m.Staleness),
		Workers: int(m.Workers), Optimizer: m.Optimizer, LR: m.Lr, Momentum: m.Momentum, LRSchedule: m.LrSchedule,
		WarmupSteps: m.WarmupSteps, NaNPolicy: config.NaNPolicy(m.NanPolicy), WireDType: config.WireDType(m.WireDtype),
		NormGuard: m.NormGuard, Aggregate: config.Aggregate(m.Aggregate), LRFactor: m.LrFactor}
	sp, err := compress.ParseSetting(m.Compress)
	if err != nil {
		return Options{}, fmt.Errorf("shard options: compress %w", err)
	}
	o.Compress = sp
	if err := o.Validate(); err != nil {
		return Options{}, fmt.Errorf("shard options: %w", err)
	}
	return o, nil
}
