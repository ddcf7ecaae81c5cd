package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/observe/bottleneck"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/task"
)

// clearScreen moves the cursor home and clears the terminal (ANSI).
const clearScreen = "\x1b[H\x1b[2J"

// topOptions configures runTop; cmdTop fills it from flags, tests directly.
type topOptions struct {
	targets  []bottleneck.Target
	interval time.Duration // between refreshes (and between the two scrapes of once)
	window   time.Duration // the live breakdown covers about this much time
	once     bool
	cores    int
	scrape   bottleneck.ScrapeFunc // nil: metrics.Scrape
	// between, if set, runs between the two scrapes of once (tests use it to
	// make the metrics move).
	between func()
	// reload, if set, reads the targets again (the live view follows an
	// elastic run's workers coming and going: docs/elastic.md).
	reload func() ([]bottleneck.Target, error)
}

// cmdTop is `pstrain top`: a live terminal view of a running cluster, read
// from the tasks' metrics endpoints.
func cmdTop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("top", "top [--targets FILE | --cluster FILE] [flags]", "A live view of every task of a running cluster: steps/s, phases, CPU, RSS, load.\nWith --once, exits with status 1 when no task answers.")
	targetsFile := fs.String("targets", "run/targets/pstrain.json", "Prometheus file_sd target file written by pstrain run (labels role and task)")
	clusterFile := fs.String("cluster", "", "cluster file (JSON, as for pstrain ps); metrics are read on each task's port + 1000")
	interval := fs.Duration("interval", 2*time.Second, "refresh every this long (with --once: the time between the two scrapes)")
	window := fs.Duration("window", 10*time.Second, "the bottleneck line covers about this much of the recent past")
	once := fs.Bool("once", false, "print one snapshot (two scrapes --interval apart) and exit")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *interval <= 0 {
		return usagef("--interval must be positive, got %s", *interval)
	}
	if *window <= 0 {
		return usagef("--window must be positive, got %s", *window)
	}
	targetsSet := false
	fs.Visit(func(f *flag.Flag) { targetsSet = targetsSet || f.Name == "targets" })
	if targetsSet && *clusterFile != "" {
		return usagef("pass --targets or --cluster, not both")
	}
	var (
		targets []bottleneck.Target
		err     error
	)
	if *clusterFile != "" {
		targets, err = clusterTargets(*clusterFile)
	} else {
		targets, err = sdTargets(*targetsFile)
	}
	if err != nil {
		return err
	}
	o := topOptions{targets: targets, interval: *interval, window: *window, once: *once, cores: runtime.NumCPU()}
	if *clusterFile == "" {
		o.reload = func() ([]bottleneck.Target, error) { return sdTargets(*targetsFile) }
	}
	return runTop(ctx, o, stdout)
}

// sdTargets reads a Prometheus file_sd JSON file: a list of
// {"targets": [host:port...], "labels": {"role": .., "task": ..}}.
func sdTargets(file string) ([]bottleneck.Target, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("target file %s does not exist: start a run with `pstrain run` (it writes run/targets/pstrain.json), or pass --targets FILE or --cluster FILE", file)
		}
		return nil, fmt.Errorf("target file: %w", err)
	}
	var groups []struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	if err := json.Unmarshal(b, &groups); err != nil {
		return nil, fmt.Errorf("target file %s: not a Prometheus file_sd list: %w", file, err)
	}
	var out []bottleneck.Target
	for _, g := range groups {
		for _, addr := range g.Targets {
			name := g.Labels["task"]
			if name == "" || len(g.Targets) > 1 {
				name = addr
			}
			out = append(out, bottleneck.Target{Task: name, Role: g.Labels["role"], URL: "http://" + addr + metrics.MetricsPath})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("target file %s lists no targets", file)
	}
	return out, nil
}

// clusterTargets derives the metrics targets of a cluster file: each task's
// gRPC port + 1000 (the default of --metrics-addr).
func clusterTargets(file string) ([]bottleneck.Target, error) {
	spec, _, err := cluster.Load(file, "")
	if err != nil {
		return nil, err
	}
	var out []bottleneck.Target
	for _, t := range spec.Tasks() {
		addr, err := spec.Addr(t)
		if err != nil {
			return nil, err
		}
		ma, err := task.DefaultMetricsAddr(addr)
		if err != nil {
			return nil, fmt.Errorf("%s: task %s: %w", file, t, err)
		}
		out = append(out, bottleneck.Target{Task: t.String(), Role: t.Type, URL: "http://" + ma + metrics.MetricsPath})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("cluster file %s lists no tasks", file)
	}
	return out, nil
}

// runTop samples the targets and prints the view: once, or every interval
// until ctx ends (which is then not an error).
func runTop(ctx context.Context, o topOptions, stdout io.Writer) error {
	mon, err := bottleneck.NewMonitor(bottleneck.MonitorConfig{Targets: o.targets, Cores: o.cores, Scrape: o.scrape})
	if err != nil {
		return err
	}
	if o.once {
		mon.Sample(ctx)
		if o.between != nil {
			o.between()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(o.interval):
		}
		mon.Sample(ctx)
		b, err := mon.Whole()
		if err != nil {
			return err
		}
		renderTop(stdout, b)
		if up(b) == 0 {
			return fmt.Errorf("top: none of the %d tasks answered: is a run going on? (see the down: lines)", len(b.Tasks))
		}
		return nil
	}
	for {
		changed, err := runTopLive(ctx, o, mon, stdout)
		switch {
		case errors.Is(err, context.Canceled) && ctx.Err() != nil:
			return nil
		case changed == nil:
			return err
		}
		// The tasks changed (workers added or removed): a new monitor
		// over them; the window starts again.
		o.targets = changed
		if mon, err = bottleneck.NewMonitor(bottleneck.MonitorConfig{Targets: o.targets, Cores: o.cores, Scrape: o.scrape}); err != nil {
			return err
		}
	}
}

// runTopLive refreshes the view every interval until ctx ends, or until
// o.reload gives other targets, which it returns.
func runTopLive(ctx context.Context, o topOptions, mon *bottleneck.Monitor, stdout io.Writer) ([]bottleneck.Target, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ticker := time.NewTicker(o.interval)
	defer ticker.Stop()
	var changed []bottleneck.Target
	err := mon.Run(ctx, ticker.C, func(bottleneck.Snapshot) {
		var sb strings.Builder
		sb.WriteString(clearScreen)
		fmt.Fprintf(&sb, "pstrain top: %d tasks, every %s, bottleneck over the last %s (Ctrl-C quits)\n\n", len(o.targets), o.interval, o.window)
		if b, err := mon.Window(o.window); err != nil {
			sb.WriteString("waiting for a second scrape...\n")
		} else {
			renderTop(&sb, b)
		}
		_, _ = io.WriteString(stdout, sb.String())
		if o.reload != nil {
			if ts, err := o.reload(); err == nil && !slices.Equal(ts, o.targets) {
				changed = ts
				cancel()
			}
		}
	})
	return changed, err
}

// up counts the tasks that answered.
func up(b bottleneck.Breakdown) int {
	n := 0
	for _, t := range b.Tasks {
		if t.Up {
			n++
		}
	}
	return n
}

// replicated says the cluster has hot standbys: some PS process is one.
func replicated(b bottleneck.Breakdown) bool {
	return slices.ContainsFunc(b.Tasks, func(t bottleneck.Task) bool { return t.Replica == "standby" || t.Replica == "deposed" })
}

// renderTop prints the task table and the bottleneck line.
func renderTop(w io.Writer, b bottleneck.Breakdown) {
	hosts := map[string]bottleneck.Host{}
	for _, h := range b.Hosts {
		hosts[h.Host] = h
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tROLE\tSTATE\tSTEPS/S\tCOMPUTE\tPUSH\tPULL\tBARRIER\tCPU\tRSS MiB\tLOAD/CORES\tSTRAGGLER\t")
	var n topCounts
	for _, t := range b.Tasks {
		n.add(t)
		fmt.Fprint(tw, strings.Join(topRow(b, t, hosts), "\t")+"\t\n")
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nworkers: %d up of %d\n", n.workersUp, n.workers)
	fmt.Fprintf(w, "parameter servers: %d up of %d", n.psUp, n.ps)
	if len(n.params) == n.ps && n.ps > 0 {
		fmt.Fprintf(w, ", parameters %s", strings.Join(n.params, " / ")) // (uneven after a rebalance)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "over %.2fs: %.1f worker steps/s, %.0f samples/s\n", b.WindowSeconds, b.StepsPerSecond, b.SamplesPerSecond)
	fmt.Fprintln(w, b.String())
	for _, e := range n.errs {
		fmt.Fprintln(w, "down:", e)
	}
	if len(b.Tasks) > 0 && up(b) == 0 {
		fmt.Fprintln(w, "no task answers: is a run going on?")
	}
}

// topCounts are the figures under top's table: the workers and the
// parameter servers (their shards' primaries) and how many are up, the
// shards' parameters, and the scrape errors.
type topCounts struct {
	workers, workersUp, ps, psUp int
	params, errs                 []string
}

// add counts task t.
func (n *topCounts) add(t bottleneck.Task) {
	if !t.Up {
		n.errs = append(n.errs, t.Task+": "+t.Error)
	}
	switch {
	case t.Role == bottleneck.RoleWorker:
		n.workers++
		if t.Up {
			n.workersUp++
		}
	case t.Role == bottleneck.RolePS && t.Replica != "standby" && t.Replica != "deposed":
		n.ps++
		if t.Up {
			n.psUp++
		}
		if t.Parameters != nil {
			n.params = append(n.params, fmt.Sprintf("%.0f", *t.Parameters))
		}
	}
}

// topRow is task t's row of the table: task, role, state, steps/s, the
// share of compute, push, pull and barrier, CPU, RSS, the host's load
// and, for a straggler, how much slower it is ("-" where unknown).
func topRow(b bottleneck.Breakdown, t bottleneck.Task, hosts map[string]bottleneck.Host) []string {
	state := "up"
	if !t.Up {
		state = "DOWN"
	}
	steps, compute, push, pull, barrier := "-", "-", "-", "-", "-"
	if t.Role == bottleneck.RoleWorker && t.Up {
		steps = fmt.Sprintf("%.1f", t.StepsPerSecond)
	}
	if p := t.Phases; p != nil {
		pct := func(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }
		compute, push, pull = pct(p.Compute), pct(p.Push), pct(p.Pull)
		if b.BarrierWaitPerPullSeconds != nil {
			barrier = pct(p.BarrierWait)
		}
	}
	cpu, rss := "-", "-"
	if t.CPUPercent != nil {
		cpu = fmt.Sprintf("%.0f%%", *t.CPUPercent)
	}
	if t.RSSBytes != nil {
		rss = fmt.Sprintf("%.1f", *t.RSSBytes/(1<<20))
	}
	load := "-"
	if h, ok := hosts[t.Host]; ok {
		load = fmt.Sprintf("%.1f/%d", h.Load1, h.Cores)
	}
	return []string{t.Task, topRole(b, t), state, steps, compute, push, pull, barrier, cpu, rss, load, slower(b, t)}
}

// slower is t's slowdown when the breakdown names it a straggler
// ("2.9x": 2.9 times slower than the others), else "-".
func slower(b bottleneck.Breakdown, t bottleneck.Task) string {
	for _, s := range b.Stragglers {
		if s.Task == t.Task {
			return fmt.Sprintf("%.1fx", s.Slowdown)
		}
	}
	return "-"
}

// topRole is t's role as the table shows it: with hot standbys, which
// process of its shard a PS is.
func topRole(b bottleneck.Breakdown, t bottleneck.Task) string {
	role := t.Role
	if role == "" {
		role = "?"
	}
	if t.Replica != "" && t.Replica != "none" && (t.Replica != "primary" || replicated(b)) {
		role = "ps-" + t.Replica // hot standbys: which process serves the shard
	}
	return role
}
