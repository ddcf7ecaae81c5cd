package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
)

// Section names, in the order Run measures them.
const (
	SectionCompute    = "compute"
	SectionWire       = "wire"
	SectionPSOverhead = "ps_overhead"
	SectionMetrics    = "metrics_overhead"
	SectionCluster    = "cluster"
	SectionEndToEnd   = "end_to_end"
	SectionMemory     = "memory"
	SectionTLS        = "tls"
	// SectionNetwork runs only when named (knownSections).
	SectionNetwork = "network"
)

// Sections lists every section name in measuring order.
func Sections() []string {
	return []string{SectionCompute, SectionWire, SectionPSOverhead, SectionMetrics, SectionCluster, SectionEndToEnd, SectionMemory, SectionTLS}
}

// knownSections are Sections and those run only for another model
// (embeddings: --model ctr) or only when named (network: root, and most
// of an hour), in measuring order.
func knownSections() []string { return append(Sections(), SectionEmbeddings, SectionNetwork) }

// ParseSections reads a comma list of section names ("" = all of
// Sections), in the canonical order, without duplicates.
func ParseSections(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return Sections(), nil
	}
	want := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(knownSections(), f) {
			return nil, fmt.Errorf("unknown bench section %q (want a comma list of %s)", f, strings.Join(knownSections(), ", "))
		}
		want[f] = true
	}
	var out []string
	for _, name := range knownSections() {
		if want[name] {
			out = append(out, name)
		}
	}
	return out, nil
}

// Config is one bench run. All dependencies are passed in.
type Config struct {
	Sections []string
	Quick    bool
	Spec     model.Spec
	Batches  []int // compute batch sizes; the first is also ps_overhead's
	BLAS     Sgemmer
	BLASName string
	Budget   time.Duration // per timed loop
	Rounds   int
	Seed     uint64
	Runner   Runner // cluster, end_to_end, memory and tls
	// TLSLink runs the tls section's link half (nil: skipped); TLSDir
	// is where its same-host runs keep their certificates.
	TLSLink LinkRunner
	TLSDir  string
	// Network runs the network section; NetworkJournal is its file of
	// finished runs (empty: none; NetworkPlan.Journal).
	Network        NetworkRunner
	NetworkJournal string
	// Load is the host's one-minute load average (nil: not recorded).
	Load func() float64
	// Embeddings is the embeddings section's plan (its model a CTR one).
	Embeddings *EmbeddingsPlan
	Now        Clock
	Progress   io.Writer // one line per measurement started; may be nil
}

// Machine describes where the figures were measured (no host name).
type Machine struct {
	Date      string `json:"date"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	CPUs      int    `json:"cpus"`
	BLAS      string `json:"blas"`
}

// Result is everything a bench run measured; sections not run are absent.
// Errors maps a section that failed to its error, so one failing section
// does not lose the others.
type Result struct {
	Machine Machine        `json:"machine"`
	Quick   bool           `json:"quick"`
	Compute *ComputeResult `json:"compute,omitempty"`
	// Wire and PSOverhead measure the default (fastest) data plane, TCP
	// frames; WireGRPC and PSOverheadGRPC the same over gRPC.
	Wire           *WireResult     `json:"wire,omitempty"`
	WireGRPC       *WireResult     `json:"wire_grpc,omitempty"`
	PSOverhead     *OverheadResult `json:"ps_overhead,omitempty"`
	PSOverheadGRPC *OverheadResult `json:"ps_overhead_grpc,omitempty"`
	// MetricsOverhead is what serving and scraping /metrics costs.
	MetricsOverhead *MetricsOverheadResult `json:"metrics_overhead,omitempty"`
	Cluster         *ClusterResult         `json:"cluster,omitempty"`
	EndToEnd        *E2EResult             `json:"end_to_end,omitempty"`
	Memory          *MemoryResult          `json:"memory,omitempty"`
	TLS             *TLSResult             `json:"tls,omitempty"`
	Network         *NetworkResult         `json:"network,omitempty"`
	Embeddings      *EmbeddingsResult      `json:"embeddings,omitempty"`
	Errors          map[string]string      `json:"errors,omitempty"`
}

// Validate reports an impossible configuration.
func (c Config) Validate() error {
	if len(c.Sections) == 0 {
		return errors.New("bench: no section selected")
	}
	for _, s := range c.Sections {
		if !slices.Contains(knownSections(), s) {
			return fmt.Errorf("bench: unknown section %q", s)
		}
	}
	if slices.Contains(c.Sections, SectionEmbeddings) && (c.Embeddings == nil || c.Embeddings.Runner == nil) {
		return errors.New("bench: embeddings needs its plan and a runner (the pstrain binary)")
	}
	if err := c.Spec.Validate(); err != nil {
		return err
	}
	if len(c.Batches) == 0 {
		return errors.New("bench: need at least one batch size")
	}
	for _, b := range c.Batches {
		if b <= 0 {
			return fmt.Errorf("bench: batch sizes must be positive, got %d", b)
		}
	}
	if err := checkDurations(c.Budget, c.Rounds); err != nil {
		return err
	}
	if c.Runner == nil && c.NeedsRunner() {
		return errors.New("bench: cluster, end_to_end, memory and tls need a runner (the pstrain binary)")
	}
	if c.Network == nil && slices.Contains(c.Sections, SectionNetwork) {
		return errors.New("bench: network needs a network runner (the pstrain binary on a netlab)")
	}
	for _, s := range []string{SectionCompute, SectionCluster, SectionEndToEnd} {
		if c.BLAS == nil && slices.Contains(c.Sections, s) {
			return fmt.Errorf("bench: %s needs a BLAS", s)
		}
	}
	return nil
}

// NeedsRunner says whether a selected section runs the pstrain binary.
func (c Config) NeedsRunner() bool {
	for _, s := range []string{SectionCluster, SectionEndToEnd, SectionMemory, SectionTLS, SectionEmbeddings, SectionNetwork} {
		if slices.Contains(c.Sections, s) {
			return true
		}
	}
	return false
}

// E2EPlan is the end_to_end grid for a full or a quick run. A full run's
// grid runs are one epoch long: the chief times training to its status
// poll, so a run of about a second would carry a large timing error.
func E2EPlan(quick bool) E2EConfig {
	if quick {
		return E2EConfig{Target: true, Modes: []string{"sync", "async"}, PS: []int{1}, Workers: []int{1, 2}, GridEpochs: 0.3}
	}
	return E2EConfig{Target: true, Modes: []string{"sync", "async"}, PS: []int{1, 2}, Workers: []int{1, 2, 4}, GridEpochs: 1}
}

// Run measures the selected sections in order. It fails only for a bad
// configuration or when ctx ends; a section's own failure is recorded in
// Result.Errors.
func Run(ctx context.Context, c Config) (*Result, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	res := &Result{Quick: c.Quick, Machine: Machine{Date: c.Now().UTC().Format("2006-01-02"), GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), BLAS: c.BLASName}}
	fail := func(section string, err error) {
		if res.Errors == nil {
			res.Errors = map[string]string{}
		}
		res.Errors[section] = err.Error()
		fmt.Fprintf(c.Progress, "bench: %s failed: %v\n", section, err)
	}
	has := func(s string) bool { return slices.Contains(c.Sections, s) }
	var err error
	if has(SectionCompute) {
		fmt.Fprintf(c.Progress, "bench: compute (batches %v, %s)\n", c.Batches, c.BLASName)
		if res.Compute, err = Compute(ctx, ComputeConfig{Spec: c.Spec, Batches: c.Batches, BLAS: c.BLAS, BLASName: c.BLASName,
			Budget: c.Budget, Rounds: c.Rounds, Seed: c.Seed, Now: c.Now}); err != nil {
			fail(SectionCompute, err)
		}
	}
	if has(SectionWire) && ctx.Err() == nil {
		fmt.Fprintln(c.Progress, "bench: wire (push+pull against 1 PS over loopback, TCP frames and gRPC, against a raw TCP echo)")
		if res.Wire, err = Wire(ctx, WireConfig{Spec: c.Spec, Budget: c.Budget, Rounds: c.Rounds, Now: c.Now, DataPlane: config.TCP}); err != nil {
			fail(SectionWire, err)
		} else if res.WireGRPC, err = Wire(ctx, WireConfig{Spec: c.Spec, Budget: c.Budget, Rounds: c.Rounds, Now: c.Now, DataPlane: config.GRPC}); err != nil {
			fail(SectionWire, err)
		}
	}
	if has(SectionPSOverhead) && ctx.Err() == nil {
		fmt.Fprintf(c.Progress, "bench: ps_overhead (1 PS + 1 worker over loopback, TCP frames and gRPC, vs in-process, batch %d)\n", c.Batches[0])
		if res.PSOverhead, err = Overhead(ctx, OverheadConfig{Spec: c.Spec, Batch: c.Batches[0], Budget: c.Budget,
			Rounds: c.Rounds, Seed: c.Seed, Now: c.Now, DataPlane: config.TCP}); err != nil {
			fail(SectionPSOverhead, err)
		} else if res.PSOverheadGRPC, err = Overhead(ctx, OverheadConfig{Spec: c.Spec, Batch: c.Batches[0], Budget: c.Budget,
			Rounds: c.Rounds, Seed: c.Seed, Now: c.Now, DataPlane: config.GRPC}); err != nil {
			fail(SectionPSOverhead, err)
		}
	}
	if has(SectionMetrics) && ctx.Err() == nil {
		fmt.Fprintf(c.Progress, "bench: metrics_overhead (1 PS + 1 worker with /metrics served and scraped every 250 ms vs not, batch %d)\n", c.Batches[0])
		if res.MetricsOverhead, err = MetricsOverhead(ctx, OverheadConfig{Spec: c.Spec, Batch: c.Batches[0], Budget: c.Budget,
			Rounds: c.Rounds, Seed: c.Seed, Now: c.Now}); err != nil {
			fail(SectionMetrics, err)
		}
	}
	ceilingConfig := ComputeConfig{Spec: c.Spec, BLAS: c.BLAS, BLASName: c.BLASName, Budget: c.Budget, Rounds: c.Rounds, Seed: c.Seed, Now: c.Now}
	if has(SectionCluster) && ctx.Err() == nil {
		plan := ClusterPlanFor(c.Quick)
		fmt.Fprintf(c.Progress, "bench: cluster (%d setups, each run for %g and %g epochs; the difference is measured)\n",
			len(plan.Setups), plan.ShortEpochs, plan.LongEpochs)
		ceil, err := ceilingFor(ctx, ceilingConfig, res.Compute, plan.Batch)
		if err == nil {
			res.Cluster, err = Cluster(ctx, c.Runner, plan, res.Machine.CPUs, ceil)
		}
		if err != nil {
			fail(SectionCluster, err)
		}
	}
	if (has(SectionEndToEnd) || has(SectionMemory)) && ctx.Err() == nil {
		plan := E2EPlan(c.Quick)
		plan.Runner = c.Runner
		if !has(SectionEndToEnd) {
			plan.Modes = nil // memory only needs the default cluster's run
		}
		fmt.Fprintf(c.Progress, "bench: end_to_end (default cluster to target, then %d short runs)\n", len(plan.Modes)*len(plan.PS)*len(plan.Workers))
		e2e, target, err := EndToEnd(ctx, plan)
		switch {
		case err != nil:
			fail(SectionEndToEnd, err)
			if has(SectionMemory) {
				fail(SectionMemory, fmt.Errorf("no run report: %w", err))
			}
		default:
			if has(SectionEndToEnd) {
				res.EndToEnd = e2e
				if err := e2e.setIdeal(ctx, ceilingConfig, res.Compute, target, res.Machine.CPUs); err != nil {
					fail(SectionEndToEnd, err)
				}
			}
			if has(SectionMemory) {
				if res.Memory, err = Memory(target); err != nil {
					fail(SectionMemory, err)
				}
			}
		}
	}
	if has(SectionTLS) && ctx.Err() == nil {
		plan := TLSPlanFor(c.Quick)
		plan.Rounds = c.Rounds
		plan.Runner, plan.Link, plan.TLSDir, plan.Load = c.Runner, c.TLSLink, c.TLSDir, c.Load
		fmt.Fprintf(c.Progress, "bench: tls (%d alternated pairs of the default cluster with and without --tls-dir, then of 1 PS + 1 worker across a netlab link)\n", plan.Rounds)
		if res.TLS, err = TLS(ctx, plan); err != nil {
			fail(SectionTLS, err)
		}
	}
	if has(SectionEmbeddings) && ctx.Err() == nil {
		fmt.Fprintf(c.Progress, "bench: embeddings (%d PS + %d workers on a synthetic set of default vocabularies, then of vocabularies capped at %d, then the same with tables pre-filled to %d parameters, then in this process)\n",
			c.Embeddings.PS, c.Embeddings.Workers, c.Embeddings.SmallVocab, c.Embeddings.ScaleParameters)
		if res.Embeddings, res.Memory, err = Embeddings(ctx, *c.Embeddings); err != nil {
			fail(SectionEmbeddings, err)
		}
	}
	if has(SectionNetwork) && ctx.Err() == nil {
		plan := NetworkPlanFor(c.Quick)
		plan.Runner, plan.Journal, plan.Progress, plan.Now, plan.Load = c.Network, c.NetworkJournal, c.Progress, c.Now, c.Load
		fmt.Fprintf(c.Progress, "bench: network (%d models x %d links x %d compressions to their held targets across emulated links)\n",
			len(plan.Models), len(plan.Links), len(plan.Compress))
		if res.Network, err = Network(ctx, plan); err != nil {
			fail(SectionNetwork, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return res, nil
}
