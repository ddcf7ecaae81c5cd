package sweep

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/observe/report"
)

// Run statuses in results.csv.
const (
	StatusOK     = "ok"
	StatusFailed = "failed"
)

// Row is one run of a sweep: one line of results.csv.
type Row struct {
	RunID    string
	ConfigID string
	Repeat   int
	Status   string // StatusOK or StatusFailed
	// Params holds every key of Keys in flag syntax, as configured (the
	// same for every repeat of a configuration).
	Params map[string]string
	// Seed is the seed the run used: the configured seed plus Repeat.
	Seed int64

	GlobalSteps         int64
	StartupSeconds      float64
	TrainSeconds        float64
	TestSeconds         float64
	WallSeconds         float64 // the whole `pstrain run`, start-up included
	SamplesPerSecond    float64
	TestAccuracy        float64 // final, 0..1
	BestTestAccuracy    float64
	TimeToTargetSeconds float64 // NaN when the target was not reached (or none was set)

	// CPU seconds summed over the tasks of each role, and in total.
	CPUChief, CPUPS, CPUWorker, CPUTotal float64
	// Peak RSS of the largest task of each role, and the sum of every
	// task's peak, in bytes.
	RSSChief, RSSPS, RSSWorker, RSSTotal float64
	// Host 1-minute load average while the run trained, from the metrics
	// samples (NaN without samples). A 1-minute average lags: in a short
	// run it mostly shows the minute before; RunQueueMean is the run's own.
	Load1Mean, Load1Max float64

	// Evidence from the run's own interval (Evidence; NaN or "" for runs
	// of sweeps made before it was measured).
	CPUsAllowed     string  // CPUs the run's processes were allowed on
	RunCPUSeconds   float64 // rusage of the run and every task it reaped
	HostCPUSeconds  float64 // busy CPU time of the host during the run
	OtherCPUSeconds float64 // HostCPUSeconds not the run's
	RunQueueMean    float64 // runnable tasks on the host, sampled during the run
	RunQueueMax     float64

	// The bottleneck verdict over the whole run and the workers' step-time
	// shares (observe/bottleneck; "" and NaN when the run had none).
	Bottleneck                                                  string
	PhaseCompute, PhasePush, PhasePull, PhaseBarrier, PhaseWait float64

	StaleDropped int64
	Restarts     int
	StoppedBy    string
	Error        string // why a failed run failed
}

// column is one results.csv column: how to print and parse it.
type column struct {
	name string
	get  func(*Row) string
	set  func(*Row, string) error
}

func fmtFloat(v float64) string {
	if math.IsNaN(v) {
		return ""
	}
	return strconv.FormatFloat(v, 'g', 7, 64)
}

func parseFloat(s string) (float64, error) {
	if s == "" {
		return math.NaN(), nil
	}
	return strconv.ParseFloat(s, 64)
}

func floatCol(name string, p func(*Row) *float64) column {
	return column{name,
		func(r *Row) string { return fmtFloat(*p(r)) },
		func(r *Row, s string) (err error) { *p(r), err = parseFloat(s); return err }}
}

func intCol(name string, p func(*Row) *int64) column {
	return column{name,
		func(r *Row) string { return strconv.FormatInt(*p(r), 10) },
		func(r *Row, s string) (err error) { *p(r), err = strconv.ParseInt(s, 10, 64); return err }}
}

func strCol(name string, p func(*Row) *string) column {
	return column{name,
		func(r *Row) string { return *p(r) },
		func(r *Row, s string) error { *p(r) = s; return nil }}
}

// columns lists results.csv's columns in order.
func columns() []column {
	cols := []column{
		strCol("run_id", func(r *Row) *string { return &r.RunID }),
		strCol("config_id", func(r *Row) *string { return &r.ConfigID }),
		{"repeat", func(r *Row) string { return strconv.Itoa(r.Repeat) },
			func(r *Row, s string) (err error) { r.Repeat, err = strconv.Atoi(s); return err }},
		strCol("status", func(r *Row) *string { return &r.Status }),
		intCol("seed_used", func(r *Row) *int64 { return &r.Seed }),
	}
	for _, k := range Keys() {
		cols = append(cols, column{k,
			func(r *Row) string { return r.Params[k] },
			func(r *Row, s string) error {
				if r.Params == nil {
					r.Params = map[string]string{}
				}
				r.Params[k] = s
				return nil
			}})
	}
	return append(cols,
		intCol("global_steps", func(r *Row) *int64 { return &r.GlobalSteps }),
		floatCol("startup_seconds", func(r *Row) *float64 { return &r.StartupSeconds }),
		floatCol("train_seconds", func(r *Row) *float64 { return &r.TrainSeconds }),
		floatCol("test_seconds", func(r *Row) *float64 { return &r.TestSeconds }),
		floatCol("wall_seconds", func(r *Row) *float64 { return &r.WallSeconds }),
		// Derived: start-up as a share of the wall time (read back, it is
		// recomputed from the two columns).
		column{"startup_share", func(r *Row) string { return fmtFloat(r.StartupShare()) }, func(*Row, string) error { return nil }},
		floatCol("samples_per_second", func(r *Row) *float64 { return &r.SamplesPerSecond }),
		floatCol("test_accuracy", func(r *Row) *float64 { return &r.TestAccuracy }),
		floatCol("best_test_accuracy", func(r *Row) *float64 { return &r.BestTestAccuracy }),
		floatCol("time_to_target_seconds", func(r *Row) *float64 { return &r.TimeToTargetSeconds }),
		floatCol("cpu_seconds_chief", func(r *Row) *float64 { return &r.CPUChief }),
		floatCol("cpu_seconds_ps", func(r *Row) *float64 { return &r.CPUPS }),
		floatCol("cpu_seconds_worker", func(r *Row) *float64 { return &r.CPUWorker }),
		floatCol("cpu_seconds_total", func(r *Row) *float64 { return &r.CPUTotal }),
		floatCol("peak_rss_bytes_chief", func(r *Row) *float64 { return &r.RSSChief }),
		floatCol("peak_rss_bytes_ps", func(r *Row) *float64 { return &r.RSSPS }),
		floatCol("peak_rss_bytes_worker", func(r *Row) *float64 { return &r.RSSWorker }),
		floatCol("peak_rss_bytes_total", func(r *Row) *float64 { return &r.RSSTotal }),
		floatCol("load1_mean", func(r *Row) *float64 { return &r.Load1Mean }),
		floatCol("load1_max", func(r *Row) *float64 { return &r.Load1Max }),
		strCol("cpus_allowed", func(r *Row) *string { return &r.CPUsAllowed }),
		floatCol("cpu_seconds_run", func(r *Row) *float64 { return &r.RunCPUSeconds }),
		floatCol("host_cpu_seconds", func(r *Row) *float64 { return &r.HostCPUSeconds }),
		floatCol("other_cpu_seconds", func(r *Row) *float64 { return &r.OtherCPUSeconds }),
		floatCol("run_queue_mean", func(r *Row) *float64 { return &r.RunQueueMean }),
		floatCol("run_queue_max", func(r *Row) *float64 { return &r.RunQueueMax }),
		strCol("bottleneck", func(r *Row) *string { return &r.Bottleneck }),
		floatCol("phase_compute", func(r *Row) *float64 { return &r.PhaseCompute }),
		floatCol("phase_push", func(r *Row) *float64 { return &r.PhasePush }),
		floatCol("phase_pull", func(r *Row) *float64 { return &r.PhasePull }),
		floatCol("phase_barrier_wait", func(r *Row) *float64 { return &r.PhaseBarrier }),
		floatCol("phase_wait", func(r *Row) *float64 { return &r.PhaseWait }),
		intCol("stale_gradients_dropped", func(r *Row) *int64 { return &r.StaleDropped }),
		column{"restarts", func(r *Row) string { return strconv.Itoa(r.Restarts) },
			func(r *Row, s string) (err error) { r.Restarts, err = strconv.Atoi(s); return err }},
		strCol("stop_reason", func(r *Row) *string { return &r.StoppedBy }),
		strCol("error", func(r *Row) *string { return &r.Error }),
	)
}

// Metric returns the value of a numeric results.csv column of r by its
// column name (e.g. "train_seconds"), and false for an unknown or
// non-numeric column.
func (r *Row) Metric(name string) (float64, bool) {
	for _, c := range columns() {
		if c.name != name {
			continue
		}
		v, err := parseFloat(c.get(r))
		return v, err == nil
	}
	return 0, false
}

// WriteCSV writes rows as CSV with a header line.
func WriteCSV(w io.Writer, rows []Row) error {
	cols := columns()
	cw := csv.NewWriter(w)
	rec := make([]string, len(cols))
	for i, c := range cols {
		rec[i] = c.name
	}
	if err := cw.Write(rec); err != nil {
		return err
	}
	for i := range rows {
		for j, c := range cols {
			rec[j] = c.get(&rows[i])
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// ReadCSV parses a results.csv written by WriteCSV. Columns are matched by
// header name, so files with columns added later still read; a missing
// run_id column is an error.
func ReadCSV(r io.Reader) ([]Row, error) {
	recs, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("results: empty file (no header)")
	}
	byName := map[string]column{}
	for _, c := range columns() {
		byName[c.name] = c
	}
	header := recs[0]
	if !strings.Contains(","+strings.Join(header, ",")+",", ",run_id,") {
		return nil, fmt.Errorf("results: header has no run_id column: %v", header)
	}
	rows := make([]Row, 0, len(recs)-1)
	for li, rec := range recs[1:] {
		row := Row{Params: map[string]string{}}
		// Columns the file lacks (added later) are unmeasured: NaN.
		for _, c := range byName {
			_ = c.set(&row, "")
		}
		for i, v := range rec {
			c, ok := byName[header[i]]
			if !ok {
				continue
			}
			if err := c.set(&row, v); err != nil {
				return nil, fmt.Errorf("results: line %d, column %s: %w", li+2, header[i], err)
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// ReadResults reads DIR/results.csv.
func ReadResults(dir string) ([]Row, error) {
	f, err := os.Open(filepath.Join(dir, ResultsFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadCSV(f)
}

// File names inside a sweep's output directory.
const (
	ResultsFile = "results.csv"
	SummaryFile = "summary.md"
	RunsDir     = "runs"
	ReportFile  = "report.json"  // in runs/ID/
	SamplesFile = "samples.csv"  // in runs/ID/
	MetaFile    = "meta.json"    // in runs/ID/
	OutputFile  = "output.log"   // in runs/ID/
	ClusterDir  = "cluster"      // in runs/ID/: the run's task logs, removed after success
	targetsFile = "pstrain.json" // in runs/ID/cluster/targets/
)

// RunDir is the directory of run id inside the sweep directory dir.
func RunDir(dir, id string) string { return filepath.Join(dir, RunsDir, id) }

// rowFromReport fills the measured fields of row from a run's report and
// its metrics samples.
func rowFromReport(row *Row, rep *report.Report, samples []Sample) {
	row.Status = StatusOK
	row.GlobalSteps = rep.GlobalSteps
	row.StartupSeconds = rep.StartupSeconds
	row.TrainSeconds = rep.TrainSeconds
	row.TestSeconds = rep.TestSeconds
	row.SamplesPerSecond = rep.SamplesPerSecond
	row.TestAccuracy = rep.TestAccuracy
	row.BestTestAccuracy = rep.BestTestAccuracy
	row.TimeToTargetSeconds = math.NaN()
	if rep.TimeToTargetSeconds != nil {
		row.TimeToTargetSeconds = *rep.TimeToTargetSeconds
	}
	for name, t := range rep.Tasks {
		role, _, _ := strings.Cut(name, "/")
		rss := float64(t.PeakRSSBytes)
		row.CPUTotal += t.CPUSeconds
		row.RSSTotal += rss
		switch role {
		case "chief":
			row.CPUChief += t.CPUSeconds
			row.RSSChief = max(row.RSSChief, rss)
		case "ps":
			row.CPUPS += t.CPUSeconds
			row.RSSPS = max(row.RSSPS, rss)
		case "worker":
			row.CPUWorker += t.CPUSeconds
			row.RSSWorker = max(row.RSSWorker, rss)
		}
	}
	row.Load1Mean, row.Load1Max = loadStats(samples)
	row.StaleDropped = rep.StaleGradientsDropped
	row.Restarts = len(rep.Restarts)
	row.StoppedBy = rep.StoppedBy
	if b := rep.Bottleneck; b != nil {
		row.Bottleneck = b.Verdict
		if p := b.Phases; p != nil {
			row.PhaseCompute, row.PhasePush, row.PhasePull, row.PhaseBarrier, row.PhaseWait = p.Compute, p.Push, p.Pull, p.BarrierWait, p.Wait
		}
	}
}

// StartupShare is the run's start-up (until the first step) as a share of
// its wall time, NaN when either is unknown.
func (r *Row) StartupShare() float64 {
	if !(r.WallSeconds > 0) || math.IsNaN(r.StartupSeconds) {
		return math.NaN()
	}
	return r.StartupSeconds / r.WallSeconds
}

// setEvidence fills the row's columns from the run's own interval.
func (r *Row) setEvidence(e Evidence) {
	r.CPUsAllowed = e.CPUsAllowed
	r.RunCPUSeconds = e.RunCPUSeconds
	r.HostCPUSeconds = e.HostCPUSeconds
	r.OtherCPUSeconds = e.OtherCPUSeconds()
	if e.RunQueueSamples > 0 {
		r.RunQueueMean, r.RunQueueMax = e.RunQueueMean, e.RunQueueMax
	}
}

// loadStats is the mean and maximum of the host load in samples, one value
// per sampling instant (the load is the host's: every task reports the
// same figure).
func loadStats(samples []Sample) (mean, maxv float64) {
	perTick := map[float64]float64{}
	for _, s := range samples {
		if !math.IsNaN(s.Load1) {
			perTick[s.Seconds] = s.Load1
		}
	}
	if len(perTick) == 0 {
		return math.NaN(), math.NaN()
	}
	var sum float64
	maxv = math.Inf(-1)
	for _, v := range perTick {
		sum += v
		maxv = max(maxv, v)
	}
	return sum / float64(len(perTick)), maxv
}
