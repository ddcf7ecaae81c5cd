package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas/gonum"

	"github.com/pstrain/pstrain/ml/model"
)

// TestSmokeComputeWireOverhead runs the three in-process sections for
// real on a small model with tiny time budgets: every figure must come out
// positive and the ratios finite.
func TestSmokeComputeWireOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("starts gRPC servers")
	}
	spec := model.Spec{Input: 64, Hidden: []int{32}, Classes: 10}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, Config{Sections: []string{SectionCompute, SectionWire, SectionPSOverhead, SectionMetrics}, Spec: spec,
		Batches: []int{16, 32}, BLAS: gonum.Implementation{}, BLASName: "gonum", Budget: 20 * time.Millisecond, Rounds: 1, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) > 0 {
		t.Fatalf("sections failed: %v", res.Errors)
	}
	c := res.Compute
	if c == nil || len(c.Batches) != 2 || c.Batch != 16 || c.SamplesPerSecond <= 0 || c.CeilingGFLOPS <= 0 || c.FractionOfCeiling <= 0 {
		t.Fatalf("compute = %+v", c)
	}
	if want := int64(2 * (2*64*32 + 3*32*10)); c.FLOPsPerSample != want {
		t.Errorf("FLOP per sample = %d, want %d", c.FLOPsPerSample, want)
	}
	w := res.Wire
	if w == nil || w.PayloadBytes != 4*spec.NumParams() || w.MBPerSecond <= 0 || w.TCPMBPerSecond <= 0 || w.FractionOfTCP <= 0 {
		t.Fatalf("wire = %+v", w)
	}
	o := res.PSOverhead
	if o == nil || o.Batch != 16 || o.Ratio <= 0 || o.PSSamplesPerSecond <= 0 || o.PSComputeMsPerStep <= 0 ||
		o.PSComputeMsPerStep > o.PSMsPerStep {
		t.Fatalf("ps_overhead = %+v", o)
	}
	if res.WireGRPC == nil || res.WireGRPC.DataPlane != "grpc" || w.DataPlane != "tcp" || res.PSOverheadGRPC == nil || res.PSOverheadGRPC.Ratio <= 0 {
		t.Fatalf("both data planes should be measured: wire %+v / %+v, overhead grpc %+v", w, res.WireGRPC, res.PSOverheadGRPC)
	}
	if m := res.MetricsOverhead; m == nil || m.Scrapes == 0 || m.OnSamplesPerSecond <= 0 || m.OffSamplesPerSecond <= 0 || m.Overhead >= 1 {
		t.Fatalf("metrics_overhead = %+v", m)
	}
	var sb strings.Builder
	if err := WriteTable(&sb, res); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"compute: fraction of ceiling", "wire: fraction of TCP", "ps_overhead: ratio", "metrics_overhead:", "grpc push+pull"} {
		if !strings.Contains(sb.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, sb.String())
		}
	}
}

func TestTCPEchoMovesBytes(t *testing.T) {
	bps, err := TCPEcho(context.Background(), nil, 1<<16, 5*time.Millisecond, 3)
	if err != nil || bps <= 0 {
		t.Fatalf("TCPEcho = %v, %v", bps, err)
	}
	if _, err := TCPEcho(context.Background(), nil, 0, time.Millisecond, 1); err == nil {
		t.Error("empty payload accepted")
	}
}
