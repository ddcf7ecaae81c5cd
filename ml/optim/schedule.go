package optim

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ScheduleKind is the shape of a learning-rate schedule.
type ScheduleKind int

// The schedule kinds.
const (
	Constant  ScheduleKind = iota // the base rate throughout
	StepDecay                     // times Factor every Epochs epochs
	Cosine                        // half a cosine from the base rate to 0 at the last version
)

// Schedule is a parsed --lr-schedule: constant, step:EPOCHS:FACTOR or
// cosine. The zero value is constant.
type Schedule struct {
	Kind   ScheduleKind
	Epochs float64 // StepDecay: epochs between decays (> 0)
	Factor float64 // StepDecay: multiplier per decay, in (0, 1]
}

// ParseSchedule reads a schedule (--lr-schedule). "" is constant (a run
// configuration written before schedules existed).
func ParseSchedule(s string) (Schedule, error) {
	switch s {
	case "", "constant":
		return Schedule{}, nil
	case "cosine":
		return Schedule{Kind: Cosine}, nil
	}
	rest, ok := strings.CutPrefix(s, "step:")
	if !ok {
		return Schedule{}, fmt.Errorf("%q: want constant, step:EPOCHS:FACTOR (e.g. step:2:0.5) or cosine", s)
	}
	es, fs, ok := strings.Cut(rest, ":")
	if !ok {
		return Schedule{}, fmt.Errorf("%q: want step:EPOCHS:FACTOR, e.g. step:2:0.5 (halve the rate every 2 epochs)", s)
	}
	e, err := strconv.ParseFloat(es, 64)
	if err != nil || !(e > 0) || math.IsInf(e, 0) {
		return Schedule{}, fmt.Errorf("%q: EPOCHS must be a positive number, got %q", s, es)
	}
	f, err := strconv.ParseFloat(fs, 64)
	if err != nil || !(f > 0) || f > 1 {
		return Schedule{}, fmt.Errorf("%q: FACTOR must be in (0, 1], got %q", s, fs)
	}
	return Schedule{Kind: StepDecay, Epochs: e, Factor: f}, nil
}

// String renders s the way ParseSchedule reads it.
func (s Schedule) String() string {
	switch s.Kind {
	case StepDecay:
		return "step:" + strconv.FormatFloat(s.Epochs, 'g', -1, 64) + ":" + strconv.FormatFloat(s.Factor, 'g', -1, 64)
	case Cosine:
		return "cosine"
	}
	return "constant"
}

// LRSchedule is a Schedule bound to a run: the learning rate at every
// version (global step) of a shard. Every shard of a run builds the same
// one, so they all apply the same rate at the same version. The zero value
// is unset: the optimizer's own rate is left alone.
type LRSchedule struct {
	Base          float64 // --lr
	Schedule      Schedule
	WarmupSteps   int64   // the rate ramps up linearly over the first WarmupSteps versions
	StepsPerEpoch float64 // versions per epoch (StepDecay)
	MaxVersion    int64   // the run's last version (Cosine)
}

// NewLRSchedule binds s to a run, checking that the run says what s
// needs: the versions in an epoch for a step schedule, the last version
// for cosine.
func NewLRSchedule(base float64, s Schedule, warmupSteps int64, stepsPerEpoch float64, maxVersion int64) (LRSchedule, error) {
	switch {
	case !(base > 0) || math.IsInf(base, 0):
		return LRSchedule{}, fmt.Errorf("lr schedule: the learning rate must be positive, got %v", base)
	case warmupSteps < 0:
		return LRSchedule{}, fmt.Errorf("lr schedule: warmup steps must be >= 0, got %d", warmupSteps)
	case s.Kind == StepDecay && (!(stepsPerEpoch > 0) || math.IsInf(stepsPerEpoch, 0)):
		return LRSchedule{}, fmt.Errorf("lr schedule %s needs the number of steps per epoch, got %v", s, stepsPerEpoch)
	case s.Kind == Cosine && maxVersion <= 0:
		return LRSchedule{}, fmt.Errorf("lr schedule %s needs the run's last step, got %d", s, maxVersion)
	}
	return LRSchedule{Base: base, Schedule: s, WarmupSteps: warmupSteps, StepsPerEpoch: stepsPerEpoch, MaxVersion: maxVersion}, nil
}

// IsZero reports whether l is unset.
func (l LRSchedule) IsZero() bool { return l.Base == 0 }

// At is the learning rate of the update applied at version v (the one
// taking the parameters from v to v+1): Base x the schedule's factor x the
// warmup factor (v+1)/WarmupSteps, capped at 1. For constant without
// warmup it is exactly Base.
func (l LRSchedule) At(v int64) float64 {
	lr := l.Base
	switch l.Schedule.Kind {
	case StepDecay:
		if n := math.Floor(float64(v) / (l.Schedule.Epochs * l.StepsPerEpoch)); n > 0 {
			lr *= math.Pow(l.Schedule.Factor, n)
		}
	case Cosine:
		x := min(1, float64(max(v, 0))/float64(l.MaxVersion))
		lr *= 0.5 * (1 + math.Cos(math.Pi*x))
	}
	if v < l.WarmupSteps {
		lr *= float64(max(v, 0)+1) / float64(l.WarmupSteps)
	}
	return lr
}
