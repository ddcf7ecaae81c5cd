package sweep

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/internal/atomicfile"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
)

// Options configures Run.
type Options struct {
	// Exe is the pstrain binary each run executes as `EXE run ...`.
	Exe string
	// Dir is the sweep's output directory (created if needed).
	Dir string
	// DataDir is passed to every run as --data-dir.
	DataDir string
	// Configs are the configurations to run (Grid.Expand), each Repeat
	// times (at least once); repeat r runs with seed+r.
	Configs []Config
	Repeat  int
	// ExtraArgs are appended to every `pstrain run` command line.
	ExtraArgs []string
	// Progress receives one line before and one after each run; nil
	// discards them.
	Progress io.Writer
	// SampleEvery is the metrics sampling period (default 1s).
	SampleEvery time.Duration
	// Scrape fetches /metrics (default metrics.Scrape).
	Scrape ScrapeFunc
	// Now is the clock (default time.Now).
	Now func() time.Time
	// StopGrace is how long a run may take to stop after ctx is cancelled
	// before it is killed (default 15s).
	StopGrace time.Duration
	// CPUs are the CPUs runs may be pinned to (OwnCPUs); cpus=N pins a run
	// to the first N. Needed only when a configuration sets cpus.
	CPUs []int
	// ProcRoot is the proc file system read for the evidence (default
	// /proc); ProcEvery is how often it is sampled (default 250ms).
	ProcRoot  string
	ProcEvery time.Duration
}

// meta is runs/ID/meta.json: what a finished run was.
type meta struct {
	Params map[string]string `json:"params"`
	Seed   int64             `json:"seed"`
	Args   []string          `json:"args"`
	// Command is the whole command line run (taskset included when pinned).
	Command     []string  `json:"command,omitempty"`
	WallSeconds float64   `json:"wall_seconds"`
	Evidence    *Evidence `json:"evidence,omitempty"`
}

// Run executes every configuration Repeat times, one after another, and
// returns one row per run attempted or found finished, in grid order.
//
// A run is finished when runs/ID/report.json exists; finished runs are not
// run again (so re-running an interrupted sweep resumes it). After every
// run, results.csv and summary.md are rewritten (atomically) for the rows so
// far, so a cancelled ctx leaves them complete for the finished runs; Run
// then returns the rows and ctx's error. A failed run is recorded as a
// failed row and the sweep goes on; Run returns an error naming how many
// failed (and they are tried again next time).
func Run(ctx context.Context, o Options) ([]Row, error) {
	if o.Exe == "" || o.Dir == "" {
		return nil, errors.New("sweep: Exe and Dir are required")
	}
	if len(o.Configs) == 0 {
		return nil, errors.New("sweep: no configurations")
	}
	o.Repeat = max(o.Repeat, 1)
	if o.SampleEvery <= 0 {
		o.SampleEvery = time.Second
	}
	if o.Scrape == nil {
		o.Scrape = metrics.Scrape
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 15 * time.Second
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.ProcEvery <= 0 {
		o.ProcEvery = 250 * time.Millisecond
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, RunsDir), 0o755); err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	type job struct {
		cfg Config
		rep int
		id  string
	}
	var jobs []job
	for _, c := range o.Configs {
		for r := 0; r < o.Repeat; r++ {
			jobs = append(jobs, job{c, r, fmt.Sprintf("%s-r%d", c.ID, r)})
		}
	}
	varied := variedKeys(o.Configs)
	var rows []Row
	// Resume: finished runs are loaded, not run.
	done := map[string]Row{}
	toRun := 0
	for _, j := range jobs {
		row, ok, err := loadFinished(o.Dir, j.id, j.cfg, j.rep)
		if err != nil {
			return nil, err
		}
		if ok {
			done[j.id] = row
		} else {
			toRun++
		}
	}
	if len(done) > 0 {
		fmt.Fprintf(o.Progress, "sweep: %d of %d runs already finished in %s; running the other %d\n", len(done), len(jobs), o.Dir, toRun)
	}
	start := o.Now()
	ran, failed := 0, 0
	for i, j := range jobs {
		if row, ok := done[j.id]; ok {
			rows = append(rows, row)
			continue
		}
		if err := ctx.Err(); err != nil {
			return rows, flush(o.Dir, rows, err)
		}
		eta := "?"
		if ran > 0 {
			per := o.Now().Sub(start) / time.Duration(ran)
			eta = (per * time.Duration(toRun-ran)).Round(time.Second).String()
		}
		fmt.Fprintf(o.Progress, "[%d/%d] %s  %s  (elapsed %s, ETA %s)\n", i+1, len(jobs), j.id, label(j.cfg.Params, varied, j.rep),
			o.Now().Sub(start).Round(time.Second), eta)
		row, err := runOne(ctx, o, j.cfg, j.rep, j.id)
		if err != nil && ctx.Err() != nil {
			return rows, flush(o.Dir, rows, ctx.Err())
		}
		ran++
		rows = append(rows, row)
		if row.Status == StatusOK {
			fmt.Fprintf(o.Progress, "      ok in %.1fs: test accuracy %.2f%%, train %.1fs, %.0f samples/s, CPU %.1fs\n",
				row.WallSeconds, 100*row.TestAccuracy, row.TrainSeconds, row.SamplesPerSecond, row.CPUTotal)
		} else {
			failed++
			fmt.Fprintf(o.Progress, "      FAILED: %s\n", firstLine(row.Error))
		}
		if err := writeOutputs(o.Dir, rows); err != nil {
			return rows, err
		}
	}
	var err error
	if failed > 0 {
		err = fmt.Errorf("sweep: %d of %d runs failed (see runs/ID/%s; re-run the sweep to retry them)", failed, len(jobs), OutputFile)
	}
	return rows, flush(o.Dir, rows, err)
}

// flush writes the outputs for rows and returns cause (or the write error).
func flush(dir string, rows []Row, cause error) error {
	if err := writeOutputs(dir, rows); err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

// writeOutputs rewrites results.csv and summary.md.
func writeOutputs(dir string, rows []Row) error {
	var csvBuf, md bytes.Buffer
	if err := WriteCSV(&csvBuf, rows); err != nil {
		return err
	}
	WriteSummary(&md, rows)
	if err := writeAtomic(filepath.Join(dir, ResultsFile), csvBuf.Bytes()); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(dir, SummaryFile), md.Bytes())
}

func writeAtomic(path string, b []byte) error {
	if err := atomicfile.Write(path, b, 0o644, atomicfile.Options{}); err != nil {
		return fmt.Errorf("sweep: %w", err)
	}
	return nil
}

// runSeed is the seed repeat rep of a configuration uses.
func runSeed(params map[string]string, rep int) (int64, error) {
	s, err := strconv.ParseInt(params["seed"], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sweep: seed %q: %w", params["seed"], err)
	}
	return s + int64(rep), nil
}

func newRow(cfg Config, rep int, id string) Row {
	seed, _ := runSeed(cfg.Params, rep)
	nan := math.NaN()
	return Row{RunID: id, ConfigID: cfg.ID, Repeat: rep, Params: cfg.Params, Seed: seed,
		TimeToTargetSeconds: nan, Load1Mean: nan, Load1Max: nan,
		RunCPUSeconds: nan, HostCPUSeconds: nan, OtherCPUSeconds: nan, RunQueueMean: nan, RunQueueMax: nan,
		PhaseCompute: nan, PhasePush: nan, PhasePull: nan, PhaseBarrier: nan, PhaseWait: nan}
}

// loadFinished rebuilds the row of a finished run from its files.
func loadFinished(dir, id string, cfg Config, rep int) (Row, bool, error) {
	rd := RunDir(dir, id)
	if _, err := os.Stat(filepath.Join(rd, ReportFile)); err != nil {
		return Row{}, false, nil
	}
	rep0, err := ReadRunReport(dir, id)
	if err != nil {
		return Row{}, false, fmt.Errorf("sweep: finished run %s: %w (delete %s to run it again)", id, err, rd)
	}
	samples, err := ReadRunSamples(dir, id)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return Row{}, false, fmt.Errorf("sweep: finished run %s: %w", id, err)
	}
	row := newRow(cfg, rep, id)
	rowFromReport(&row, rep0, samples)
	var m meta
	if b, err := os.ReadFile(filepath.Join(rd, MetaFile)); err == nil && json.Unmarshal(b, &m) == nil {
		row.WallSeconds = m.WallSeconds
		if m.Evidence != nil {
			row.setEvidence(*m.Evidence)
		}
	}
	return row, true, nil
}

// runOne executes one run. The returned error is set only when ctx was
// cancelled; a failed run is a row with StatusFailed.
func runOne(ctx context.Context, o Options, cfg Config, rep int, id string) (Row, error) {
	row := newRow(cfg, rep, id)
	fail := func(err error) (Row, error) {
		row.Status = StatusFailed
		row.Error = err.Error()
		return row, nil
	}
	rd := RunDir(o.Dir, id)
	cdir := filepath.Join(rd, ClusterDir)
	if err := os.RemoveAll(rd); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(cdir, 0o755); err != nil {
		return fail(err)
	}
	seed, err := runSeed(cfg.Params, rep)
	if err != nil {
		return fail(err)
	}
	sdDir := filepath.Join(cdir, "targets")
	tmpReport := filepath.Join(cdir, ReportFile)
	args := append([]string{"run", "--report", tmpReport, "--run-dir", cdir, "--sd-dir", sdDir, "--data-dir", o.DataDir},
		RunFlags(cfg.Params, seed)...)
	args = append(args, o.ExtraArgs...)
	name, argv, err := Command(o.Exe, args, cfg.Params[KeyCPUs], o.CPUs)
	if err != nil {
		return fail(err)
	}
	out, err := os.Create(filepath.Join(rd, OutputFile))
	if err != nil {
		return fail(err)
	}
	defer out.Close()
	watcher := procWatcher{root: o.ProcRoot, every: o.ProcEvery}
	host0, hostErr := watcher.hostStat()
	cmd := exec.CommandContext(ctx, name, argv...)
	cmd.Stdout, cmd.Stderr = out, out
	// Let `pstrain run` stop its tasks cleanly; kill it only if it hangs.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = o.StopGrace
	t0 := o.Now()
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("starting %s: %w", o.Exe, err))
	}
	sctx, stopSampling := context.WithCancel(ctx)
	samplesCh := make(chan []Sample, 1)
	go func() {
		s := sampler{targetsPath: filepath.Join(sdDir, targetsFile), every: o.SampleEvery, scrape: o.Scrape, now: o.Now}
		samplesCh <- s.run(sctx, t0)
	}()
	evCh := make(chan Evidence, 1)
	go func() { evCh <- watcher.watch(sctx, cmd.Process.Pid) }()
	runErr := cmd.Wait()
	stopSampling()
	samples := <-samplesCh
	ev := <-evCh
	row.WallSeconds = o.Now().Sub(t0).Seconds()
	if host1, err := watcher.hostStat(); err == nil && hostErr == nil {
		ev.HostCPUSeconds = busySeconds(host0, host1)
	}
	if ps := cmd.ProcessState; ps != nil {
		ev.RunCPUSeconds = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	if ctx.Err() != nil {
		return row, ctx.Err()
	}
	if runErr != nil {
		return fail(fmt.Errorf("pstrain run: %v\n%s", runErr, tailFile(filepath.Join(rd, OutputFile), 15)))
	}
	rp, err := report.Read(tmpReport)
	if err != nil {
		return fail(err)
	}
	var sb bytes.Buffer
	if err := WriteSamples(&sb, samples); err != nil {
		return fail(err)
	}
	if err := writeAtomic(filepath.Join(rd, SamplesFile), sb.Bytes()); err != nil {
		return fail(err)
	}
	mb, _ := json.MarshalIndent(meta{Params: cfg.Params, Seed: seed, Args: args, Command: append([]string{name}, argv...),
		WallSeconds: row.WallSeconds, Evidence: &ev}, "", "  ")
	if err := writeAtomic(filepath.Join(rd, MetaFile), append(mb, '\n')); err != nil {
		return fail(err)
	}
	// The report is the commit point: a run is finished once it is in place.
	if err := os.Rename(tmpReport, filepath.Join(rd, ReportFile)); err != nil {
		return fail(err)
	}
	// The task logs are large and only useful for failures.
	_ = os.RemoveAll(cdir)
	rowFromReport(&row, rp, samples)
	row.setEvidence(ev)
	return row, nil
}

// RunFlags are the `pstrain run` flags of a configuration, run with seed:
// every key but cpus (which the sweep applies with taskset). model=mlp, the
// run's default, is left out so that a pstrain built without other models
// (and without --model) runs it.
func RunFlags(params map[string]string, seed int64) []string {
	var out []string
	for _, k := range Keys() {
		v := params[k]
		switch {
		case k == KeyCPUs, k == "model" && (v == "mlp" || v == ""):
			continue
		case k == "seed":
			v = strconv.FormatInt(seed, 10)
		}
		out = append(out, "--"+k+"="+v)
	}
	return out
}

// tailFile returns the last n lines of a file (for error messages).
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// variedKeys are the keys taking more than one value over configs, in Keys
// order, without the ones that follow from an earlier varied key: model=cnn
// brings its own --conv, --hidden, --lr and --warmup-steps defaults, and
// those are consequences of the model axis, not axes of their own.
func variedKeys(configs []Config) []string {
	var out []string
	for _, k := range Keys() {
		seen := map[string]bool{}
		for _, c := range configs {
			seen[c.Params[k]] = true
		}
		if len(seen) > 1 && !slices.ContainsFunc(out, func(j string) bool { return determines(configs, j, k) }) {
			out = append(out, k)
		}
	}
	return out
}

// determines says whether key j's value fixes key k's over configs (k is
// a function of j).
func determines(configs []Config, j, k string) bool {
	of := map[string]string{}
	for _, c := range configs {
		if v, ok := of[c.Params[j]]; ok && v != c.Params[k] {
			return false
		}
		of[c.Params[j]] = c.Params[k]
	}
	return true
}

// VariedKeys are the parameters taking more than one value over rows, in
// Keys order.
func VariedKeys(rows []Row) []string { return variedKeys(configsOf(rows)) }

// configsOf is the configuration of each row.
func configsOf(rows []Row) []Config {
	cs := make([]Config, len(rows))
	for i, r := range rows {
		cs[i] = Config{Params: r.Params}
	}
	return cs
}

// label describes a run by its varied parameters.
func label(params map[string]string, varied []string, rep int) string {
	var parts []string
	for _, k := range varied {
		parts = append(parts, k+"="+params[k])
	}
	parts = append(parts, fmt.Sprintf("repeat %d", rep))
	return strings.Join(parts, " ")
}

// Label describes a configuration by the given parameters, e.g.
// "mode=sync workers=2" (used as plot legends).
func Label(params map[string]string, keys []string) string {
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"="+params[k])
	}
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, " ")
}
