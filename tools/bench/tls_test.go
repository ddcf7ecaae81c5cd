package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// scriptedRunner answers runs with the next samples/s and records their
// arguments.
type scriptedRunner struct {
	rates []float64
	calls [][]string
}

func (s *scriptedRunner) Run(_ context.Context, args []string) (*report.Report, time.Duration, error) {
	s.calls = append(s.calls, args)
	r := s.rates[0]
	s.rates = s.rates[1:]
	// 10 s of training on two tasks, each busy a fixed 4 s of CPU.
	return &report.Report{SamplesPerSecond: r, TrainSeconds: 10,
		Tasks: map[string]report.Task{"ps/0": {CPUSeconds: 4}, "worker/0": {CPUSeconds: 4}}}, time.Second, nil
}

type scriptedLink struct {
	skip  error
	rates []float64
	order []LinkMode
}

func (l *scriptedLink) Prepare(context.Context) error { return l.skip }
func (l *scriptedLink) Kind() string                  { return "test link" }
func (l *scriptedLink) Close() error                  { return nil }
func (l *scriptedLink) Run(_ context.Context, mode LinkMode, _ float64) (float64, float64, error) {
	l.order = append(l.order, mode)
	r := l.rates[0]
	l.rates = l.rates[1:]
	return r, 1 / r, nil // CPU per sample as if CPU-bound
}

// The runs alternate plain and TLS, and each ratio is the median of the
// pairs' ratios: one disturbed pair does not move it.
func TestTLSAlternatesAndTakesTheMedianPair(t *testing.T) {
	run := &scriptedRunner{rates: []float64{100, 95, 100, 30, 80, 76}}
	link := &scriptedLink{rates: []float64{50, 45, 48, 40, 36, 38, 60, 10, 6}}
	loads := []float64{3, 5}
	res, err := TLS(context.Background(), TLSConfig{Runner: run, Link: link, Rounds: 3, Epochs: 2, LinkEpochs: 1, TLSDir: "/certs",
		Load: func() float64 { l := loads[0]; loads = loads[1:]; return l }})
	if err != nil {
		t.Fatal(err)
	}
	for i, args := range run.calls {
		if tls := slices.Contains(args, "--tls-dir"); tls != (i%2 == 1) || !slices.Contains(args, "2") {
			t.Fatalf("run %d: %v; want plain and --tls-dir alternating, 2 epochs", i, args)
		}
	}
	if fmt.Sprint(link.order) != "[plain tls integrity plain tls integrity plain tls integrity]" {
		t.Fatalf("link runs in order %v", link.order)
	}
	if res.SameHostRatio != 0.95 || res.LinkRatio == nil || *res.LinkRatio != 0.9 || res.Load1Before != 3 || res.Load1After != 5 {
		t.Fatalf("same host %v, link %v, load %v -> %v; want 0.95, 0.9, 3 -> 5", res.SameHostRatio, res.LinkRatio, res.Load1Before, res.Load1After)
	}
	// The same CPU for fewer samples is more CPU per sample: the CPU
	// ratio follows the rates here.
	if p := res.SameHostRuns[0]; math.Abs(p.PlainCPUMicrosPerSample-8e6/1000) > 1e-6 || math.Abs(p.CPURatio-0.95) > 1e-9 {
		t.Fatalf("first pair %+v; want 8000 us per sample plain and a CPU ratio of 0.95", p)
	}
	// The integrity-only runs: 0.96, 0.95 and 0.1 of plain.
	if res.IntegrityLinkRatio == nil || math.Abs(*res.IntegrityLinkRatio-0.95) > 1e-9 || math.Abs(res.LinkRuns[0].IntegrityRatio-0.96) > 1e-9 {
		t.Fatalf("integrity link ratio %v, first round %+v; want 0.95 and 0.96", res.IntegrityLinkRatio, res.LinkRuns[0])
	}
	if math.Abs(res.SameHostCPURatio-0.95) > 1e-9 || res.LinkCPURatio == nil || math.Abs(*res.LinkCPURatio-0.9) > 1e-9 {
		t.Fatalf("CPU ratios %v, %v; want 0.95 and 0.9", res.SameHostCPURatio, res.LinkCPURatio)
	}
}

func TestTLSLinkSkippedSaysWhy(t *testing.T) {
	run := &scriptedRunner{rates: []float64{100, 90}}
	res, err := TLS(context.Background(), TLSConfig{Runner: run, Link: &scriptedLink{skip: fmt.Errorf("%w: not root", ErrSkip)}, Rounds: 1, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.LinkRatio != nil || !strings.Contains(res.LinkSkipped, "not root") || res.SameHostRatio != 0.9 {
		t.Fatalf("link %v skipped %q, same host %v", res.LinkRatio, res.LinkSkipped, res.SameHostRatio)
	}
	var b strings.Builder
	writeTLSTable(&b, res)
	if !strings.Contains(b.String(), "skipped (skipped: not root)") {
		t.Fatalf("table:\n%s", b.String())
	}
}
