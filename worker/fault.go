package worker

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// GradientFault poisons a worker's gradients, for tests and demos of the
// divergence guard (--fault-gradient, like `pstrain run --fault` for
// kills): the worker multiplies its gradient by Scale before pushing it,
// once, at its first step computed from parameters of version Step or
// later, or at every step if Every is set.
type GradientFault struct {
	Worker int // the worker index it applies to
	Step   int64
	Every  bool
	Scale  float32
}

func (f GradientFault) String() string {
	at := strconv.FormatInt(f.Step, 10)
	if f.Every {
		at = "every"
	}
	return fmt.Sprintf("worker/%d@%s:%g", f.Worker, at, f.Scale)
}

// ParseGradientFaults reads --fault-gradient: a comma list of
// worker/I@STEP:SCALE (once, at global step STEP) or
// worker/I@every:SCALE (every step), e.g. "worker/1@30:1e6" or
// "worker/3@every:-4". Worker indices must be below workers.
func ParseGradientFaults(s string, workers int) ([]GradientFault, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []GradientFault
	for _, part := range strings.Split(s, ",") {
		f, err := parseGradientFault(strings.TrimSpace(part), workers)
		if err != nil {
			return nil, fmt.Errorf("--fault-gradient %q: %w", part, err)
		}
		out = append(out, f)
	}
	return out, nil
}

func parseGradientFault(s string, workers int) (GradientFault, error) {
	bad := fmt.Errorf("want worker/I@STEP:SCALE or worker/I@every:SCALE with I in 0..%d (e.g. worker/1@30:1e6)", workers-1)
	task, rest, ok := strings.Cut(s, "@")
	at, scale, ok2 := strings.Cut(rest, ":")
	idx, ok3 := strings.CutPrefix(task, "worker/")
	if !ok || !ok2 || !ok3 {
		return GradientFault{}, bad
	}
	var f GradientFault
	var err error
	if f.Worker, err = strconv.Atoi(idx); err != nil || f.Worker < 0 || f.Worker >= workers {
		return GradientFault{}, bad
	}
	if at == "every" {
		f.Every = true
	} else if f.Step, err = strconv.ParseInt(at, 10, 64); err != nil || f.Step < 0 {
		return GradientFault{}, fmt.Errorf("step %q is not a global step (a number >= 0, or every)", at)
	}
	x, err := strconv.ParseFloat(scale, 32)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		return GradientFault{}, fmt.Errorf("scale %q is not a finite number", scale)
	}
	f.Scale = float32(x)
	return f, nil
}

// faults is a worker's GradientFaults and which of them fired.
type faults struct {
	list   []GradientFault
	fired  []bool
	logged bool // the first poisoned gradient was logged
}

// scale is the factor for a gradient computed from version (1: none)
// and marks the one-time faults it fires.
func (fs *faults) scale(version int64) float32 {
	k := float32(1)
	for i, f := range fs.list {
		switch {
		case f.Every:
			k *= f.Scale
		case !fs.fired[i] && version >= f.Step:
			fs.fired[i] = true
			k *= f.Scale
		}
	}
	return k
}
