package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseScenario(t *testing.T) {
	sc, err := ParseScenario("workers=32, ps=4, net=10gbit")
	if err != nil {
		t.Fatal(err)
	}
	if sc.Workers != 32 || sc.PS != 4 || sc.BytesPerSecond != 1.25e9 || sc.Latency != 50*time.Microsecond {
		t.Fatalf("scenario = %+v", sc)
	}
	sc, err = ParseScenario("workers=2,ps=1,net=100mbit,latency=1ms")
	if err != nil || sc.BytesPerSecond != 12.5e6 || sc.Latency != time.Millisecond {
		t.Fatalf("scenario = %+v, %v", sc, err)
	}
	for _, bad := range []string{"workers=0,ps=1,net=1gbit", "workers=1,ps=1", "workers=1,ps=1,net=fast",
		"workers=1,ps=1,net=1gbit,gpus=2", "workers", "workers=1,ps=-1,net=1gbit", "workers=1,ps=1,net=-3gbit"} {
		if _, err := ParseScenario(bad); err == nil || !strings.Contains(err.Error(), "--predict") {
			t.Errorf("ParseScenario(%q) = %v, want a --predict error", bad, err)
		}
	}
}

func TestPredictArithmetic(t *testing.T) {
	// Round numbers: t_c 10 ms, P 1 MB, s 1 ns/B, u 0.1 ns/B, batch 100.
	c := Calibration{Batch: 100, ComputeSeconds: 0.010, ParamBytes: 1e6, SoftwareSecondsPerByte: 1e-9, UpdateSecondsPerByte: 1e-10}
	// 1 worker, 1 PS, 1 GB/s, no latency: terms 1 ms (software), 1 ms
	// (link), 1 ms (ps link), 0.5 ms (ps software); update 0.1 ms.
	p, err := Predict(c, Scenario{Workers: 1, PS: 1, BytesPerSecond: 1e9})
	if err != nil {
		t.Fatal(err)
	}
	if !near(p.StepSeconds, 0.0121) || !near(p.SamplesPerSecond, 100/0.0121) || !near(p.KneeWorkers, 5) ||
		!near(p.CeilingSamplesPerSecond, 1e9*100/2e6) || !near(p.Efficiency, 0.010/0.0121) {
		t.Fatalf("prediction = %+v", p)
	}
	// 20 workers, 2 PS: the PS links dominate (10 ms per direction).
	p, _ = Predict(c, Scenario{Workers: 20, PS: 2, BytesPerSecond: 1e9, Latency: time.Millisecond})
	if p.Bound != "ps link" || !near(p.StepSeconds, 0.010+0.002+0.020+20*0.5e6*1e-10) {
		t.Fatalf("prediction = %+v", p)
	}
	// A fast network leaves the PS's software cost as the bound.
	p, _ = Predict(c, Scenario{Workers: 20, PS: 2, BytesPerSecond: 1e12})
	if p.Bound != "ps software" {
		t.Fatalf("bound = %s, want ps software", p.Bound)
	}
	if _, err := Predict(Calibration{}, Scenario{Workers: 1, PS: 1, BytesPerSecond: 1}); err == nil {
		t.Error("empty calibration accepted")
	}
}

// TestPredictReference pins the figures docs/scaling.md quotes.
func TestPredictReference(t *testing.T) {
	p, err := Predict(ReferenceCalibration(), Scenario{Workers: 32, PS: 4, BytesPerSecond: 1.25e9, Latency: 50 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(p.SamplesPerSecond-97_000) > 1500 || math.Abs(p.KneeWorkers-7.5) > 0.1 ||
		math.Abs(p.CeilingSamplesPerSecond-125_800) > 500 || p.Bound != "ps link" {
		t.Fatalf("reference prediction = %+v", p)
	}
}

func TestCalibrationFrom(t *testing.T) {
	r := &Result{Wire: &WireResult{PayloadBytes: 1000, MsPerRoundTrip: 2, UpdateMs: 0.5},
		PSOverhead: &OverheadResult{Batch: 64, PSComputeMsPerStep: 8}}
	c, err := CalibrationFrom(r)
	if err != nil {
		t.Fatal(err)
	}
	if c.Batch != 64 || !near(c.ComputeSeconds, 0.008) || c.ParamBytes != 1000 || !near(c.SoftwareSecondsPerByte, 1e-6) ||
		!near(c.UpdateSecondsPerByte, 5e-7) {
		t.Fatalf("calibration = %+v", c)
	}
	if _, err := CalibrationFrom(&Result{Wire: r.Wire}); err == nil {
		t.Error("calibration without ps_overhead accepted")
	}
}
