package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
)

// WriteTable prints the result as aligned text: one block per section,
// the headline ratio first.
func WriteTable(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	m := r.Machine
	fmt.Fprintf(tw, "pstrain bench  %s  %s %s/%s  %d CPUs  BLAS %s", m.Date, m.GoVersion, m.OS, m.Arch, m.CPUs, m.BLAS)
	if r.Quick {
		fmt.Fprint(tw, "  (quick)")
	}
	fmt.Fprintln(tw)
	if c := r.Compute; c != nil {
		model := ""
		if c.Model != "" {
			model = " of " + c.Model
		}
		fmt.Fprintf(tw, "\ncompute: fraction of ceiling %.2f (forward+backward%s vs the step's %d matrix products on %s; %d FLOP/sample)\n",
			c.FractionOfCeiling, model, c.Products, c.BLAS, c.FLOPsPerSample)
		fmt.Fprintln(tw, "  batch\tsamples/s\tGFLOP/s\tceiling samples/s\tceiling GFLOP/s\tfraction")
		for _, b := range c.Batches {
			fmt.Fprintf(tw, "  %d\t%.0f\t%.1f\t%.0f\t%.1f\t%.2f\n", b.Batch, b.SamplesPerSecond, b.GFLOPS,
				b.CeilingSamplesPerSecond, b.CeilingGFLOPS, b.FractionOfCeiling)
		}
	}
	if x := r.Wire; x != nil {
		fmt.Fprintf(tw, "\nwire: fraction of TCP %.3f (%s data plane; push+pull of %.2f MB each way, 1 PS, loopback)\n", x.FractionOfTCP, x.DataPlane, float64(x.PayloadBytes)/1e6)
		fmt.Fprintln(tw, "  path\tMB/s\tms per round trip\tfraction of TCP")
		for _, y := range []*WireResult{x, r.WireGRPC} {
			if y != nil {
				fmt.Fprintf(tw, "  %s push+pull\t%.0f\t%.2f\t%.3f\n", y.DataPlane, y.MBPerSecond, y.MsPerRoundTrip, y.FractionOfTCP)
			}
		}
		fmt.Fprintf(tw, "  raw TCP echo\t%.0f\t%.2f\t\n", x.TCPMBPerSecond, x.TCPMsPerRoundTrip)
		fmt.Fprintf(tw, "  PS SGD update alone (in-process)\t\t%.2f\t\n", x.UpdateMs)
	}
	if o := r.PSOverhead; o != nil {
		fmt.Fprintf(tw, "\nps_overhead: ratio %.2f (%s data plane; 1 PS + 1 worker over loopback vs in-process, %s, batch %d)\n", o.Ratio, o.DataPlane, o.Mode, o.Batch)
		fmt.Fprintln(tw, "  path\tsamples/s\tms/step\tcompute ms\tcomm ms\tratio")
		fmt.Fprintf(tw, "  in-process\t%.0f\t%.2f\t\t\t\n", o.InProcessSamplesPerSecond, o.InProcessMsPerStep)
		for _, y := range []*OverheadResult{o, r.PSOverheadGRPC} {
			if y != nil {
				fmt.Fprintf(tw, "  1 PS, %s\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\n", y.DataPlane, y.PSSamplesPerSecond, y.PSMsPerStep, y.PSComputeMsPerStep, y.PSCommunicationMsPerStep, y.Ratio)
			}
		}
	}
	if m := r.MetricsOverhead; m != nil {
		fmt.Fprintf(tw, "\nmetrics_overhead: %.1f%% of throughput (/metrics of the PS and the worker served and scraped every %.2g s, %d scrapes of %.1f ms; batch %d)\n",
			100*m.Overhead, m.ScrapeEverySeconds, m.Scrapes, m.ScrapeMillisecondsMean, m.Batch)
		fmt.Fprintf(tw, "  metrics off\t%.0f samples/s\n  metrics on\t%.0f samples/s\n", m.OffSamplesPerSecond, m.OnSamplesPerSecond)
	}
	if c := r.Cluster; c != nil {
		fmt.Fprintf(tw, "\ncluster: efficiency %.2f (samples/s of the default cluster vs %d cores x one process's ceiling of %.0f samples/s at batch %d = %.0f)\n",
			c.Efficiency, c.Cores, c.CeilingSamplesPerSecond, c.Batch, c.MachineSamplesPerSecond)
		fmt.Fprintln(tw, "  setup\tsamples/s\tefficiency\tmeasured samples\tmeasured s\tcompute\tpush\tpull\tbarrier")
		for _, row := range c.Runs {
			if row.Error != "" {
				fmt.Fprintf(tw, "  %s\tfailed: %s\t\t\t\t\t\t\t\n", row.Name, row.Error)
				continue
			}
			ph := "\t\t\t"
			if p := row.Phases; p != nil {
				ph = fmt.Sprintf("%.0f%%\t%.0f%%\t%.0f%%\t%.0f%%", 100*p.Compute, 100*p.Push, 100*p.Pull, 100*p.BarrierWait)
			}
			fmt.Fprintf(tw, "  %s\t%.0f\t%.2f\t%d\t%.2f\t%s\n", row.Name, row.SamplesPerSecond, row.Efficiency,
				row.MeasuredSamples, row.MeasuredSeconds, ph)
		}
		for _, name := range slices.Sorted(maps.Keys(c.ReplicaThroughput)) {
			fmt.Fprintf(tw, "  with hot standbys (--ps-replicas 1), %s keeps %.2f of its samples/s\n", name, c.ReplicaThroughput[name])
		}
	}
	if e := r.EndToEnd; e != nil {
		ttt := "not reached"
		if e.TimeToTargetSeconds != nil {
			ttt = fmt.Sprintf("%.2f s", *e.TimeToTargetSeconds)
		}
		fmt.Fprintf(tw, "\nend_to_end: time to %.1f%%: %s; whole run %.2f s (startup %.2f s), %.0f samples/s, final acc %.2f%%\n",
			100*e.TargetAccuracy, ttt, e.WallSeconds, e.StartupSeconds, e.SamplesPerSecond, 100*e.TestAccuracy)
		if x := e.TimeToTargetOverIdeal; x != nil {
			fmt.Fprintf(tw, "  time to target / ideal %.2f (ideal %.2f s: %d samples at %d cores x %.0f samples/s)\n",
				*x, e.IdealSeconds, e.SamplesToTarget, e.Cores, e.CeilingSamplesPerSecond)
		}
		if len(e.Runs) > 0 {
			fmt.Fprintln(tw, "  mode\tPS\tworkers\tepochs\tsamples/s\ttrain s\twall s\tstartup s")
			for _, row := range e.Runs {
				if row.Error != "" {
					fmt.Fprintf(tw, "  %s\t%d\t%d\t%g\tfailed: %s\t\t\t\n", row.Mode, row.PS, row.Workers, row.Epochs, row.Error)
					continue
				}
				fmt.Fprintf(tw, "  %s\t%d\t%d\t%g\t%.0f\t%.2f\t%.2f\t%.2f\n", row.Mode, row.PS, row.Workers, row.Epochs,
					row.SamplesPerSecond, row.TrainSeconds, row.WallSeconds, row.StartupSeconds)
			}
		}
	}
	if mem := r.Memory; mem != nil {
		goal := mem.Goal
		if goal == "" {
			goal = "RSS <= 3 x state + 40 MiB"
		}
		fmt.Fprintf(tw, "\nmemory: PS RSS / state %.1f (%s, %s; goal: %s: %v)\n", mem.PSRSSOverState, mem.Model, mem.Optimizer, goal, mem.MeetsGoal)
		fmt.Fprintln(tw, "  task\tpeak RSS MiB\tstate MiB\tRSS/state\tgoal MiB")
		for _, s := range mem.Shards {
			fmt.Fprintf(tw, "  %s\t%.1f\t%.2f\t%.1f\t%.1f\n", s.Task, mib(s.PeakRSSBytes), mib(s.StateBytes), s.RSSOverState, mib(s.GoalBytes))
		}
		fmt.Fprintf(tw, "\n  role\ttasks\tpeak RSS MiB\tgoal MiB\tmeets goal\n")
		for _, r := range []struct {
			name string
			r    MemoryRole
		}{{"worker", mem.Roles.Worker}, {"chief", mem.Roles.Chief}, {"ps", mem.Roles.PS}} {
			goal := "per shard"
			if r.r.GoalBytes > 0 {
				goal = fmt.Sprintf("%.0f", mib(r.r.GoalBytes))
			}
			fmt.Fprintf(tw, "  %s\t%d\t%.1f\t%s\t%v\n", r.name, r.r.Tasks, mib(r.r.PeakRSSBytes), goal, r.r.MeetsGoal)
		}
		fmt.Fprintf(tw, "  all tasks\t%d\t%.1f\t\t\n", mem.Roles.Worker.Tasks+mem.Roles.Chief.Tasks+mem.Roles.PS.Tasks, mib(mem.TotalPeakRSSBytes))
	}
	if r.TLS != nil {
		writeTLSTable(tw, r.TLS)
	}
	if r.Embeddings != nil {
		writeEmbeddingsTable(tw, r.Embeddings)
	}
	if r.Network != nil {
		writeNetworkTable(tw, r.Network)
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(tw, "\nfailed sections:")
		var names []string
		for k := range r.Errors {
			names = append(names, k)
		}
		slices.Sort(names)
		for _, k := range names {
			fmt.Fprintf(tw, "  %s\t%s\n", k, r.Errors[k])
		}
	}
	return tw.Flush()
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
