package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// TLSPair is one alternated pair of runs: the same cluster without and
// with mutual TLS, back to back.
type TLSPair struct {
	PlainSamplesPerSecond float64 `json:"plain_samples_per_second"`
	TLSSamplesPerSecond   float64 `json:"tls_samples_per_second"`
	Ratio                 float64 `json:"ratio"`
}

// TLSResult is the tls section: what mutual TLS costs training, on one
// host (the default local cluster, whose same-host tasks keep the Unix
// socket and shared memory under TLS) and across a link (1 PS + 1 worker
// in two network namespaces joined by a netlab link, TLS against plain
// TCP). Each ratio is the median of the ratios of alternated pairs, so
// a burst of load from other processes on a shared machine spoils one
// pair, not the figure.
type TLSResult struct {
	Epochs        float64   `json:"epochs"`
	SameHostRatio float64   `json:"same_host_ratio"`
	SameHostRuns  []TLSPair `json:"same_host_runs"`
	// LinkRatio is null when the link runs could not be made here;
	// LinkSkipped says why (not root, no `ip`, no namespaces).
	LinkRatio   *float64  `json:"link_ratio"`
	LinkSkipped string    `json:"link_skipped,omitempty"`
	LinkRuns    []TLSPair `json:"link_runs,omitempty"`
	LinkKind    string    `json:"link_kind,omitempty"`
	// Load1 is the host's one-minute load average before and after the
	// runs: how shared the machine was.
	Load1Before float64 `json:"load1_before"`
	Load1After  float64 `json:"load1_after"`
}

// LinkRunner trains 1 PS + 1 worker across a link, with or without
// mutual TLS, and returns the run's samples per second. ErrSkip (wrapped)
// from Prepare says the link cannot be built here.
type LinkRunner interface {
	Prepare(ctx context.Context) error
	Run(ctx context.Context, withTLS bool, epochs float64) (float64, error)
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

// TLSPlanFor is the tls section's plan for a full or quick bench.
func TLSPlanFor(quick bool) TLSConfig {
	if quick {
		return TLSConfig{Rounds: 2, Epochs: 1, LinkEpochs: 0.5}
	}
	return TLSConfig{Rounds: 3, Epochs: 3, LinkEpochs: 1}
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
		res.SameHostRuns = append(res.SameHostRuns, pair(plain.SamplesPerSecond, secure.SamplesPerSecond))
	}
	res.SameHostRatio = medianRatio(res.SameHostRuns)
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
		plain, err := c.Link.Run(ctx, false, c.LinkEpochs)
		if err != nil {
			return err
		}
		secure, err := c.Link.Run(ctx, true, c.LinkEpochs)
		if err != nil {
			return err
		}
		res.LinkRuns = append(res.LinkRuns, pair(plain, secure))
	}
	r := medianRatio(res.LinkRuns)
	res.LinkRatio = &r
	return nil
}

func pair(plain, secure float64) TLSPair {
	return TLSPair{PlainSamplesPerSecond: plain, TLSSamplesPerSecond: secure, Ratio: ratio(secure, plain)}
}

// medianRatio is the median of the pairs' ratios (the mean of the middle
// two for an even count).
func medianRatio(ps []TLSPair) float64 {
	if len(ps) == 0 {
		return 0
	}
	r := make([]float64, len(ps))
	for i, p := range ps {
		r[i] = p.Ratio
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
	fmt.Fprintln(w, "  setting\tplain samples/s\tTLS samples/s\tratio")
	for _, p := range x.SameHostRuns {
		fmt.Fprintf(w, "  same host\t%.0f\t%.0f\t%.3f\n", p.PlainSamplesPerSecond, p.TLSSamplesPerSecond, p.Ratio)
	}
	if x.LinkRatio == nil {
		fmt.Fprintf(w, "  link ratio: skipped (%s)\n", x.LinkSkipped)
		return
	}
	fmt.Fprintf(w, "  link ratio %.3f (1 PS + 1 worker across a netlab link, %s)\n", *x.LinkRatio, x.LinkKind)
	for _, p := range x.LinkRuns {
		fmt.Fprintf(w, "  link\t%.0f\t%.0f\t%.3f\n", p.PlainSamplesPerSecond, p.TLSSamplesPerSecond, p.Ratio)
	}
}
