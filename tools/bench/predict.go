package bench

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Calibration holds the per-step costs the scaling model is built from,
// all measured by this package on one machine.
type Calibration struct {
	Batch int `json:"batch"`
	// ComputeSeconds is one worker's step without communication (batch,
	// forward, backward): ps_overhead's compute share.
	ComputeSeconds float64 `json:"compute_seconds"`
	// ParamBytes is what a worker pushes (and pulls) per step.
	ParamBytes float64 `json:"param_bytes"`
	// SoftwareSecondsPerByte is gRPC's CPU cost per payload byte of a
	// round trip (both ends): wire's ms per round trip / (2 * payload).
	SoftwareSecondsPerByte float64 `json:"software_seconds_per_byte"`
	// UpdateSecondsPerByte is the PS update's cost per gradient byte.
	UpdateSecondsPerByte float64 `json:"update_seconds_per_byte"`
}

// ReferenceCalibration is the 784-800-10 MLP at batch 128 as measured on
// the project machine over gRPC (BENCHMARKS.md, the scaling diary,
// "Measured ratios", run A).
func ReferenceCalibration() Calibration {
	return Calibration{Batch: 128, ComputeSeconds: 7.59e-3, ParamBytes: 2544040,
		SoftwareSecondsPerByte: 3.86e-3 / (2 * 2544040), UpdateSecondsPerByte: 0.22e-3 / 2544040}
}

// CalibrationFrom takes the costs from a bench result that has the wire
// and ps_overhead sections.
func CalibrationFrom(r *Result) (Calibration, error) {
	if r.Wire == nil || r.PSOverhead == nil {
		return Calibration{}, errors.New("bench: calibration needs the wire and ps_overhead sections")
	}
	w, o := r.Wire, r.PSOverhead
	if w.PayloadBytes <= 0 || w.MsPerRoundTrip <= 0 || o.PSComputeMsPerStep <= 0 {
		return Calibration{}, errors.New("bench: calibration needs positive wire and compute figures")
	}
	p := float64(w.PayloadBytes)
	return Calibration{Batch: o.Batch, ComputeSeconds: o.PSComputeMsPerStep / 1e3, ParamBytes: p,
		SoftwareSecondsPerByte: w.MsPerRoundTrip / 1e3 / (2 * p), UpdateSecondsPerByte: w.UpdateMs / 1e3 / p}, nil
}

// Scenario is a cluster to predict: each worker and PS on its own host,
// hosts joined by links of BytesPerSecond (full duplex) and Latency.
type Scenario struct {
	Workers        int
	PS             int
	BytesPerSecond float64
	Latency        time.Duration
}

// ParseScenario reads "workers=32,ps=4,net=10gbit[,latency=50us]". Net
// accepts a number with gbit, mbit or gbyte (GB/s); latency defaults to
// 50 µs.
func ParseScenario(s string) (Scenario, error) {
	sc := Scenario{Latency: 50 * time.Microsecond}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return Scenario{}, fmt.Errorf("--predict: %q is not key=value (want workers=N,ps=M,net=10gbit[,latency=50us])", kv)
		}
		var err error
		switch k {
		case "workers":
			sc.Workers, err = strconv.Atoi(v)
		case "ps":
			sc.PS, err = strconv.Atoi(v)
		case "net":
			sc.BytesPerSecond, err = parseBandwidth(v)
		case "latency":
			sc.Latency, err = time.ParseDuration(v)
		default:
			return Scenario{}, fmt.Errorf("--predict: unknown key %q (want workers, ps, net, latency)", k)
		}
		if err != nil {
			return Scenario{}, fmt.Errorf("--predict: %s=%s: %w", k, v, err)
		}
	}
	return sc, sc.Validate()
}

// Validate reports an impossible scenario.
func (sc Scenario) Validate() error {
	switch {
	case sc.Workers < 1:
		return fmt.Errorf("--predict: workers must be at least 1, got %d", sc.Workers)
	case sc.PS < 1:
		return fmt.Errorf("--predict: ps must be at least 1, got %d", sc.PS)
	case sc.BytesPerSecond <= 0:
		return errors.New("--predict: net must be a positive bandwidth such as 10gbit")
	case sc.Latency < 0:
		return fmt.Errorf("--predict: latency must not be negative, got %v", sc.Latency)
	}
	return nil
}

func parseBandwidth(v string) (float64, error) {
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"gbyte", 1e9}} {
		if num, ok := strings.CutSuffix(strings.ToLower(v), u.suffix); ok {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil || f <= 0 {
				return 0, fmt.Errorf("want a positive number before %s", u.suffix)
			}
			return f * u.mult, nil
		}
	}
	return 0, errors.New("want a bandwidth such as 10gbit, 100mbit or 2gbyte")
}

// Prediction is the model's answer for a scenario.
type Prediction struct {
	Workers          int     `json:"workers"`
	PS               int     `json:"ps"`
	StepSeconds      float64 `json:"step_seconds"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// Efficiency is SamplesPerSecond over Workers times one worker's
	// compute-only rate.
	Efficiency float64 `json:"efficiency"`
	// Bound names the largest communication term: "worker software",
	// "worker link", "ps link" or "ps software".
	Bound string `json:"bound"`
	// KneeWorkers is where the PS links' time equals the compute time:
	// past it, workers add little.
	KneeWorkers float64 `json:"knee_workers"`
	// CeilingSamplesPerSecond is the PS links' limit, reached as
	// workers grow without bound.
	CeilingSamplesPerSecond float64 `json:"ceiling_samples_per_second"`
}

// Predict is the sync-SGD step model of docs/scaling.md:
//
//	T = t_c + 2L + 2·max(P·s, P/B, N·P/(M·B), N·P·s/(2M)) + N·(P/M)·u
//
// with t_c compute, P bytes per direction per worker, s gRPC cost per
// byte of a round trip (about half of it on the PS), u the PS update cost
// per byte, N workers, M PS, B link bandwidth and L latency. Push and pull
// are sequential in a sync step, hence the factor 2.
func Predict(c Calibration, sc Scenario) (Prediction, error) {
	if err := sc.Validate(); err != nil {
		return Prediction{}, err
	}
	if c.Batch <= 0 || c.ComputeSeconds <= 0 || c.ParamBytes <= 0 || c.SoftwareSecondsPerByte < 0 || c.UpdateSecondsPerByte < 0 {
		return Prediction{}, fmt.Errorf("bench: calibration %+v has a non-positive figure", c)
	}
	n, m, p, b := float64(sc.Workers), float64(sc.PS), c.ParamBytes, sc.BytesPerSecond
	terms := []struct {
		name string
		sec  float64
	}{
		{"worker software", p * c.SoftwareSecondsPerByte},
		{"worker link", p / b},
		{"ps link", n * p / (m * b)},
		{"ps software", n * p * c.SoftwareSecondsPerByte / (2 * m)},
	}
	worst := terms[0]
	for _, t := range terms[1:] {
		if t.sec > worst.sec {
			worst = t
		}
	}
	step := c.ComputeSeconds + 2*sc.Latency.Seconds() + 2*worst.sec + n*(p/m)*c.UpdateSecondsPerByte
	pr := Prediction{Workers: sc.Workers, PS: sc.PS, StepSeconds: step, Bound: worst.name,
		SamplesPerSecond:        n * float64(c.Batch) / step,
		KneeWorkers:             c.ComputeSeconds * m * b / (2 * p),
		CeilingSamplesPerSecond: m * b * float64(c.Batch) / (2 * p),
	}
	pr.Efficiency = pr.SamplesPerSecond / (n * float64(c.Batch) / c.ComputeSeconds)
	return pr, nil
}
