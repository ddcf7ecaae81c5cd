package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/pstrain/pstrain/observe/report"
)

// TLSPair is one alternated pair of runs: the same cluster without and
// with mutual TLS, back to back.
type TLSPair struct {
	PlainSamplesPerSecond float64 `json:"plain_samples_per_second"`
	TLSSamplesPerSecond   float64 `json:"tls_samples_per_second"`
	Ratio                 float64 `json:"ratio"`
	// The CPU time every task of the run spent per sample trained, in
	// microseconds, and CPURatio = plain's / TLS's: what TLS costs in
	// CPU, which other processes' load disturbs far less than the
	// rates (0 when a run did not say).
	PlainCPUMicrosPerSample float64 `json:"plain_cpu_us_per_sample"`
	TLSCPUMicrosPerSample   float64 `json:"tls_cpu_us_per_sample"`
	CPURatio                float64 `json:"cpu_ratio"`
	// The integrity-only mode's run (--data-plane-privacy integrity),
	// in the link's pairs only: its rate, IntegrityRatio = its rate over
	// plain's, its CPU per sample and IntegrityCPURatio = plain's over
	// its.
	IntegritySamplesPerSecond   float64 `json:"integrity_samples_per_second,omitempty"`
	IntegrityRatio              float64 `json:"integrity_ratio,omitempty"`
	IntegrityCPUMicrosPerSample float64 `json:"integrity_cpu_us_per_sample,omitempty"`
	IntegrityCPURatio           float64 `json:"integrity_cpu_ratio,omitempty"`
}

// tlsRun is what one run of a pair measured.
type tlsRun struct {
	samplesPerSecond float64
	cpuPerSample     float64 // seconds of CPU, every task, per sample; 0: unknown
}

// TLSResult is the tls section: what mutual TLS costs training, on one
// host (the default local cluster, whose same-host tasks keep the Unix
// socket and shared memory under TLS) and across a link (1 PS + 1 worker
// in two network namespaces joined by a netlab link, TLS against plain
// TCP). Each ratio is the median of the ratios of alternated pairs, so
// a burst of load from other processes on a shared machine spoils one
// pair, not the figure.
type TLSResult struct {
	Epochs        float64 `json:"epochs"`
	SameHostRatio float64 `json:"same_host_ratio"`
	// SameHostCPURatio is the median of the pairs' CPU ratios.
	SameHostCPURatio float64   `json:"same_host_cpu_ratio"`
	SameHostRuns     []TLSPair `json:"same_host_runs"`
	// LinkRatio is null when the link runs could not be made here;
	// LinkSkipped says why (not root, no `ip`, no namespaces).
	LinkRatio    *float64  `json:"link_ratio"`
	LinkCPURatio *float64  `json:"link_cpu_ratio"`
	LinkSkipped  string    `json:"link_skipped,omitempty"`
	LinkRuns     []TLSPair `json:"link_runs,omitempty"`
	LinkKind     string    `json:"link_kind,omitempty"`
	// IntegrityLinkRatio is the link's integrity-only runs against
	// plain TCP, median of the rounds (null with LinkRatio).
	IntegrityLinkRatio    *float64 `json:"integrity_link_ratio"`
	IntegrityLinkCPURatio *float64 `json:"integrity_link_cpu_ratio"`
	// Load1 is the host's one-minute load average before and after the
	// runs: how shared the machine was.
	Load1Before float64 `json:"load1_before"`
	Load1After  float64 `json:"load1_after"`
}

// LinkMode is how a link run's data plane crosses the link.
type LinkMode string

// The link's modes.
const (
	LinkPlain     LinkMode = "plain"     // plain TCP (--insecure)
	LinkTLS       LinkMode = "tls"       // mutual TLS (--tls-dir)
	LinkIntegrity LinkMode = "integrity" // --tls-dir --data-plane-privacy integrity
)

// linkModes are a round's runs, in order.
var linkModes = [...]LinkMode{LinkPlain, LinkTLS, LinkIntegrity}

// LinkRunner trains 1 PS + 1 worker across a link in a LinkMode, and
// returns the run's samples per second. ErrSkip (wrapped) from Prepare
// says the link cannot be built here.
type LinkRunner interface {
	Prepare(ctx context.Context) error
	// Run returns the run's samples per second and the CPU seconds its
	// tasks spent per sample (0: unknown).
	Run(ctx context.Context, mode LinkMode, epochs float64) (samplesPerSecond, cpuPerSample float64, err error)
	Kind() string
	Close() error
}

// ErrSkip marks a measurement this machine cannot make (and why).
var ErrSkip = errors.New("skipped")

// TLSConfig configures the tls section.
type TLSConfig struct {
	Runner     Runner     // the local cluster
	Link       LinkRunner // nil: no link runs (LinkSkipped says so)
	Rounds     int        // alternated pairs per setting
	Epochs     float64    // per same-host run
	LinkEpochs float64    // per link run
	TLSDir     string     // where the same-host runs' certificates go (made by the first)
	Load       func() float64
}

// TLSPlanFor is the tls section's plan for a full or quick bench. A
// full bench's link runs are 3 epochs, 12-14 s: the chief notices a
// run's start and end on its 100 ms poll, a few percent of a 1-epoch
// run of 4 s, and a longer run measures the rate training keeps
// (BENCHMARKS.md, "AES-GCM on vector AES").
func TLSPlanFor(quick bool) TLSConfig {
	if quick {
		return TLSConfig{Rounds: 2, Epochs: 1, LinkEpochs: 0.5}
	}
	return TLSConfig{Rounds: 3, Epochs: 3, LinkEpochs: 3}
}

// TLS measures the tls section.
func TLS(ctx context.Context, c TLSConfig) (*TLSResult, error) {
	if c.Rounds < 1 || c.Epochs <= 0 || c.Runner == nil {
		return nil, fmt.Errorf("bench: tls: need a runner, rounds >= 1 and epochs > 0")
	}
	if c.Load == nil {
		c.Load = func() float64 { return 0 }
	}
	res := &TLSResult{Epochs: c.Epochs, Load1Before: c.Load()}
	base := []string{"--epochs", strconv.FormatFloat(c.Epochs, 'g', -1, 64), "--target-accuracy", "0", "--eval-every", "0"}
	withTLS := append(slices.Clone(base), "--tls-dir", c.TLSDir)
	for range c.Rounds {
		plain, _, err := c.Runner.Run(ctx, base)
		if err != nil {
			return nil, err
		}
		secure, _, err := c.Runner.Run(ctx, withTLS)
		if err != nil {
			return nil, err
		}
		res.SameHostRuns = append(res.SameHostRuns, pair(reportRun(plain), reportRun(secure)))
	}
	res.SameHostRatio, res.SameHostCPURatio = medianRatio(res.SameHostRuns, rateRatio), medianRatio(res.SameHostRuns, cpuRatio)
	if err := linkRuns(ctx, c, res); err != nil {
		return res, err
	}
	res.Load1After = c.Load()
	return res, nil
}

// linkRuns fills the link half of res; a link that cannot be built here
// is a skip with its reason, not a failure.
func linkRuns(ctx context.Context, c TLSConfig, res *TLSResult) error {
	if c.Link == nil {
		res.LinkSkipped = "no link runner"
		return nil
	}
	defer c.Link.Close()
	if err := c.Link.Prepare(ctx); err != nil {
		if errors.Is(err, ErrSkip) {
			res.LinkSkipped = err.Error()
			return nil
		}
		return err
	}
	res.LinkKind = c.Link.Kind()
	for range c.Rounds {
		var runs [len(linkModes)]tlsRun
		for i, mode := range linkModes {
			rate, cpu, err := c.Link.Run(ctx, mode, c.LinkEpochs)
			if err != nil {
				return err
			}
			runs[i] = tlsRun{samplesPerSecond: rate, cpuPerSample: cpu}
		}
		p := pair(runs[0], runs[1])
		p.IntegritySamplesPerSecond, p.IntegrityRatio = runs[2].samplesPerSecond, ratio(runs[2].samplesPerSecond, runs[0].samplesPerSecond)
		p.IntegrityCPUMicrosPerSample, p.IntegrityCPURatio = 1e6*runs[2].cpuPerSample, ratio(runs[0].cpuPerSample, runs[2].cpuPerSample)
		res.LinkRuns = append(res.LinkRuns, p)
	}
	r, cr := medianRatio(res.LinkRuns, rateRatio), medianRatio(res.LinkRuns, cpuRatio)
	ir, icr := medianRatio(res.LinkRuns, integrityRatio), medianRatio(res.LinkRuns, integrityCPURatio)
	res.LinkRatio, res.LinkCPURatio, res.IntegrityLinkRatio, res.IntegrityLinkCPURatio = &r, &cr, &ir, &icr
	return nil
}

// The ratios of a pair medianRatio takes.
func rateRatio(p TLSPair) float64         { return p.Ratio }
func cpuRatio(p TLSPair) float64          { return p.CPURatio }
func integrityRatio(p TLSPair) float64    { return p.IntegrityRatio }
func integrityCPURatio(p TLSPair) float64 { return p.IntegrityCPURatio }

// reportRun is what a run's report says: its rate, and its tasks' CPU
// time over the samples it trained.
func reportRun(r *report.Report) tlsRun {
	cpu := 0.0
	for _, t := range r.Tasks {
		cpu += t.CPUSeconds
	}
	samples := r.SamplesPerSecond * r.TrainSeconds
	if samples <= 0 {
		return tlsRun{samplesPerSecond: r.SamplesPerSecond}
	}
	return tlsRun{samplesPerSecond: r.SamplesPerSecond, cpuPerSample: cpu / samples}
}

func pair(plain, secure tlsRun) TLSPair {
	return TLSPair{PlainSamplesPerSecond: plain.samplesPerSecond, TLSSamplesPerSecond: secure.samplesPerSecond,
		Ratio: ratio(secure.samplesPerSecond, plain.samplesPerSecond), PlainCPUMicrosPerSample: 1e6 * plain.cpuPerSample,
		TLSCPUMicrosPerSample: 1e6 * secure.cpuPerSample, CPURatio: ratio(plain.cpuPerSample, secure.cpuPerSample)}
}

// medianRatio is the median of the pairs' ratios that of picks, the
// mean of the middle two for an even count.
func medianRatio(ps []TLSPair, of func(TLSPair) float64) float64 {
	if len(ps) == 0 {
		return 0
	}
	r := make([]float64, len(ps))
	for i, p := range ps {
		r[i] = of(p)
	}
	slices.Sort(r)
	n := len(r)
	if n%2 == 1 {
		return r[n/2]
	}
	return (r[n/2-1] + r[n/2]) / 2
}

// writeTLSTable prints the tls section.
func writeTLSTable(w io.Writer, x *TLSResult) {
	fmt.Fprintf(w, "\ntls: same-host ratio %.3f (default cluster, --tls-dir vs without, %g epochs; median of alternated pairs; load %.1f -> %.1f)\n",
		x.SameHostRatio, x.Epochs, x.Load1Before, x.Load1After)
	fmt.Fprintf(w, "  same-host CPU ratio %.3f (CPU per sample, plain over TLS)\n", x.SameHostCPURatio)
	fmt.Fprintln(w, "  setting\tplain samples/s\tTLS samples/s\tratio\tplain CPU us/sample\tTLS CPU us/sample\tCPU ratio")
	row := func(name string, p TLSPair) {
		fmt.Fprintf(w, "  %s\t%.0f\t%.0f\t%.3f\t%.1f\t%.1f\t%.3f\n", name, p.PlainSamplesPerSecond, p.TLSSamplesPerSecond, p.Ratio,
			p.PlainCPUMicrosPerSample, p.TLSCPUMicrosPerSample, p.CPURatio)
	}
	for _, p := range x.SameHostRuns {
		row("same host", p)
	}
	if x.LinkRatio == nil {
		fmt.Fprintf(w, "  link ratio: skipped (%s)\n", x.LinkSkipped)
		return
	}
	fmt.Fprintf(w, "  link ratio %.3f, CPU ratio %.3f (1 PS + 1 worker across a netlab link, %s)\n", *x.LinkRatio, *x.LinkCPURatio, x.LinkKind)
	for _, p := range x.LinkRuns {
		row("link", p)
	}
	if x.IntegrityLinkRatio != nil {
		fmt.Fprintf(w, "  integrity-only link ratio %.3f, CPU ratio %.3f (--data-plane-privacy integrity against plain TCP)\n", *x.IntegrityLinkRatio, *x.IntegrityLinkCPURatio)
		for _, p := range x.LinkRuns {
			fmt.Fprintf(w, "  link integrity\t%.0f\t%.0f\t%.3f\t%.1f\t%.1f\t%.3f\n", p.PlainSamplesPerSecond, p.IntegritySamplesPerSecond, p.IntegrityRatio,
				p.PlainCPUMicrosPerSample, p.IntegrityCPUMicrosPerSample, p.IntegrityCPURatio)
		}
	}
}
