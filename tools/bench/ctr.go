package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/optim"
	"github.com/pstrain/pstrain/observe/report"
)

// SectionEmbeddings measures a CTR model's embedding tables on a real
// cluster (pstrain bench --model ctr): what a step moves, how the row
// requests spread over the shards, every role's memory, the speed
// against one process, and the speed of large tables against small ones.
const SectionEmbeddings = "embeddings"

// The embeddings section's goals (docs/models.md, "The bench").
const (
	// WireGoal: bytes per step at most 1.1x (unique keys x D x 4 x 2) +
	// the dense model's bytes (pulled and pushed).
	WireGoal = 1.1
	// BalanceGoal: no shard serves more than 1.25x the mean share of the
	// row requests.
	BalanceGoal = 1.25
	// SpeedGoal: the cluster's samples/s over cores x one process's.
	SpeedGoal = 0.6
	// ScaleGoal: the large tables' steps/s at least this fraction of the
	// small tables' (the same speed, within the shared machine's noise).
	ScaleGoal = 0.9
	// CTRRoleGoalBytes is a CTR worker's (and chief's) peak RSS goal: it
	// must not grow with the tables.
	CTRRoleGoalBytes = 150 << 20
	// ctrPSAllowance and ctrPSFactor: a PS's peak RSS at most 1.3x its
	// state (rows, their optimizer state, its dense slice and its
	// optimizer state) + 50 MiB.
	ctrPSAllowance = 50 << 20
	ctrPSFactor    = 1.3
)

// EmbeddingsPlan is what the section runs: three clusters of PS shards
// and Workers on synthetic sets it writes into DataDir, the first with
// the default vocabularies (the headline figures), the second with each
// field's vocabulary capped at SmallVocab, the third on the second's set
// with its tables pre-filled to ScaleParameters (--embedding-prefill;
// the scale comparison is the third against the second), then the same
// model in this process on the first set.
type EmbeddingsPlan struct {
	Runner     WatchRunner
	DataDir    string
	Spec       model.Spec // a CTR model (config.Run.CTRSpec)
	Rows       embed.Rule
	Dense      optim.Config
	Batch      int
	PS         int
	Workers    int
	Train      int // training samples of each set; each run trains one epoch
	Test       int
	SmallVocab int
	// ScaleParameters is what the large tables of the scale comparison
	// hold at least, over every table: each is pre-filled with its share
	// of rows (ScalePrefill).
	ScaleParameters int64
	Seed            uint64
	// Ceiling is the longest the in-process run is timed for.
	Ceiling  time.Duration
	Interval time.Duration // between scrapes of the cluster's metrics
	Cores    int
	Now      Clock
}

// EmbeddingsPlanFor sizes the plan of a full or a quick bench run; the
// caller sets the model, the runner and the directory.
func EmbeddingsPlanFor(quick bool) EmbeddingsPlan {
	if quick {
		return EmbeddingsPlan{PS: 2, Workers: 2, Train: 24000, Test: 2000, SmallVocab: 100, ScaleParameters: 2_000_000,
			Ceiling: 2 * time.Second, Interval: 50 * time.Millisecond}
	}
	return EmbeddingsPlan{PS: 2, Workers: 2, Train: 400000, Test: 20000, SmallVocab: 4000, ScaleParameters: 100_000_000,
		Ceiling: 15 * time.Second, Interval: 250 * time.Millisecond}
}

// ScalePrefill is the rows each table of spec is pre-filled with for its
// tables to hold params parameters between them (rounded up).
func ScalePrefill(spec model.Spec, params int64) int64 {
	per := int64(max(spec.Fields, 1)) * int64(max(spec.EmbeddingDim, 1))
	return (params + per - 1) / per
}

// EmbeddingsRun is one cluster run's figures over its training window
// (TrainingWindow): per worker step, or per second of the window.
type EmbeddingsRun struct {
	Name     string `json:"name"`
	VocabCap int    `json:"vocab_cap"` // 0: the default vocabularies (10 to 10^7)
	// PrefillRows is each table's pre-filled rows (--embedding-prefill).
	PrefillRows int64 `json:"prefill_rows"`
	Train       int   `json:"train_samples"`
	// Rows and Parameters are the tables' at the run's last scrape.
	Rows              int64     `json:"rows"`
	Parameters        int64     `json:"parameters"`
	TableBytes        int64     `json:"table_bytes"`
	StepsPerSecond    float64   `json:"steps_per_second"` // worker steps, summed over the workers
	SamplesPerSecond  float64   `json:"samples_per_second"`
	BytesPerStep      float64   `json:"bytes_per_step"`
	RowBytesPerStep   float64   `json:"row_bytes_per_step"`
	DenseBytesPerStep float64   `json:"dense_bytes_per_step"`
	UniqueKeysPerStep float64   `json:"unique_keys_per_step"`
	ShardRequestShare []float64 `json:"shard_request_share"`
	// CPUMsPerStep is the CPU the PS and the workers spent per worker
	// step (process_cpu_seconds_total): what a step costs, which the
	// shared machine's load moves much less than the steps/s.
	CPUMsPerStep    float64 `json:"cpu_ms_per_step"`
	MeasuredSteps   float64 `json:"measured_steps"`
	MeasuredSeconds float64 `json:"measured_seconds"`
	WallSeconds     float64 `json:"wall_seconds"`
	AUC             float64 `json:"auc"`
	PlantedAUC      float64 `json:"planted_auc"`
}

// EmbeddingsScale compares the speed of the small tables' run and of the
// large ones' (the same data, its tables pre-filled), and gives the
// latter's memory.
type EmbeddingsScale struct {
	SmallParameters     int64   `json:"small_parameters"`
	LargeParameters     int64   `json:"large_parameters"`
	SmallStepsPerSecond float64 `json:"small_steps_per_second"`
	LargeStepsPerSecond float64 `json:"large_steps_per_second"`
	// Ratio is the large tables' steps/s over the small ones'; CPURatio
	// the small tables' CPU per step over the large ones' (1: a step of
	// each costs the same).
	Ratio             float64 `json:"ratio"`
	MeetsGoal         bool    `json:"meets_goal"`
	SmallCPUMsPerStep float64 `json:"small_cpu_ms_per_step"`
	LargeCPUMsPerStep float64 `json:"large_cpu_ms_per_step"`
	CPURatio          float64 `json:"cpu_ratio"`
	// LargePrefillRows is each of the large run's tables' pre-filled rows.
	LargePrefillRows int64 `json:"large_prefill_rows"`
	// Memory is the large run's: each PS's peak RSS against 1.3 x its
	// state + 50 MiB, a worker's and the chief's against 150 MiB;
	// MeetsPSMemoryGoal and MeetsWorkerMemoryGoal are its verdicts.
	Memory                *MemoryResult `json:"memory,omitempty"`
	MeetsPSMemoryGoal     bool          `json:"meets_ps_memory_goal"`
	MeetsWorkerMemoryGoal bool          `json:"meets_worker_memory_goal"`
}

// EmbeddingsResult is the embeddings section (embeddings.* in the JSON,
// an architecture contract). The top-level figures are the default
// vocabularies' run's.
type EmbeddingsResult struct {
	Rows              int64     `json:"rows"`
	Parameters        int64     `json:"parameters"`
	BytesPerStep      float64   `json:"bytes_per_step"`
	UniqueKeysPerStep float64   `json:"unique_keys_per_step"`
	ShardRequestShare []float64 `json:"shard_request_share"`
	EmbeddingDim      int       `json:"embedding_dim"`
	DenseParameters   int       `json:"dense_parameters"`
	// WireBoundBytesPerStep is 1.1 x (unique keys x D x 4 x 2) + the
	// dense model's bytes pulled and pushed (2 x 4 x DenseParameters).
	WireBoundBytesPerStep float64 `json:"wire_bound_bytes_per_step"`
	BytesOverBound        float64 `json:"bytes_over_bound"`
	MeetsWireGoal         bool    `json:"meets_wire_goal"`
	MaxShareOverMean      float64 `json:"max_share_over_mean"`
	MeetsBalanceGoal      bool    `json:"meets_balance_goal"`
	// Efficiency is SamplesPerSecond / (Cores x CeilingSamplesPerSecond),
	// the ceiling being the same model trained in this process.
	SamplesPerSecond        float64         `json:"samples_per_second"`
	CeilingSamplesPerSecond float64         `json:"ceiling_samples_per_second"`
	Cores                   int             `json:"cores"`
	Efficiency              float64         `json:"efficiency"`
	MeetsSpeedGoal          bool            `json:"meets_speed_goal"`
	Scale                   EmbeddingsScale `json:"scale"`
	Runs                    []EmbeddingsRun `json:"runs"`
}

// Embeddings runs the plan. It returns the section and the memory
// figures of the default vocabularies' run.
func Embeddings(ctx context.Context, p EmbeddingsPlan) (*EmbeddingsResult, *MemoryResult, error) {
	if p.Runner == nil || !p.Spec.IsCTR() {
		return nil, nil, errors.New("bench: embeddings needs a runner and a CTR model")
	}
	if p.Now == nil {
		p.Now = time.Now
	}
	def, rep, last, err := embeddingsRun(ctx, p, runPlan{name: "default", set: "default"})
	if err != nil {
		return nil, nil, err
	}
	mem, err := ctrMemory(rep, last, p.Spec)
	if err != nil {
		return nil, nil, err
	}
	small, large, largeMem, err := scaleRuns(ctx, p)
	if err != nil {
		return nil, nil, err
	}
	ceil, err := CTRCeiling(ctx, p, setDir(p, "default"))
	if err != nil {
		return nil, nil, err
	}
	res := embeddingsResult(p, def, small, ceil)
	res.Runs = append(res.Runs, large)
	res.Scale = embeddingsScale(small, large, largeMem)
	return res, mem, nil
}

// scaleRuns are the scale comparison's runs: the small vocabularies'
// set, then the same with its tables pre-filled to ScaleParameters. Both
// checkpoint only at the end, after their training windows: a checkpoint
// writes every row, so periodic ones would cost the large tables' run
// what its steps do not.
func scaleRuns(ctx context.Context, p EmbeddingsPlan) (small, large EmbeddingsRun, mem *MemoryResult, err error) {
	only := []string{"--checkpoint-every=0"}
	if small, _, _, err = embeddingsRun(ctx, p, runPlan{name: "small", set: "small", vocabCap: p.SmallVocab, extra: only}); err != nil {
		return small, large, nil, err
	}
	n := ScalePrefill(p.Spec, p.ScaleParameters)
	rp := runPlan{name: "large", set: "small", vocabCap: p.SmallVocab, prefill: n, reuse: true,
		extra: append(only, "--embedding-prefill="+strconv.FormatInt(n, 10))}
	large, rep, last, err := embeddingsRun(ctx, p, rp)
	if err != nil {
		return small, large, nil, err
	}
	mem, err = ctrMemory(rep, last, p.Spec)
	return small, large, mem, err
}

// embeddingsScale compares the small and the large tables' runs.
func embeddingsScale(small, large EmbeddingsRun, mem *MemoryResult) EmbeddingsScale {
	s := EmbeddingsScale{SmallParameters: small.Parameters, LargeParameters: large.Parameters,
		SmallStepsPerSecond: small.StepsPerSecond, LargeStepsPerSecond: large.StepsPerSecond,
		Ratio: ratio(large.StepsPerSecond, small.StepsPerSecond), SmallCPUMsPerStep: small.CPUMsPerStep,
		LargeCPUMsPerStep: large.CPUMsPerStep, CPURatio: ratio(small.CPUMsPerStep, large.CPUMsPerStep),
		LargePrefillRows: large.PrefillRows, Memory: mem}
	s.MeetsGoal = s.Ratio >= ScaleGoal
	if mem != nil {
		s.MeetsPSMemoryGoal, s.MeetsWorkerMemoryGoal = mem.Roles.PS.MeetsGoal, mem.Roles.Worker.MeetsGoal
	}
	return s
}

// embeddingsResult puts the runs' figures together.
func embeddingsResult(p EmbeddingsPlan, large, small EmbeddingsRun, ceil float64) *EmbeddingsResult {
	dense := p.Spec.NumParams()
	r := &EmbeddingsResult{Rows: large.Rows, Parameters: large.Parameters, BytesPerStep: large.BytesPerStep,
		UniqueKeysPerStep: large.UniqueKeysPerStep, ShardRequestShare: large.ShardRequestShare,
		EmbeddingDim: p.Spec.EmbeddingDim, DenseParameters: dense, SamplesPerSecond: large.SamplesPerSecond,
		CeilingSamplesPerSecond: ceil, Cores: p.Cores, Runs: []EmbeddingsRun{large, small}}
	r.WireBoundBytesPerStep = WireBound(large.UniqueKeysPerStep, p.Spec.EmbeddingDim, dense)
	r.BytesOverBound = ratio(r.BytesPerStep, r.WireBoundBytesPerStep)
	r.MeetsWireGoal = r.BytesPerStep > 0 && r.BytesPerStep <= r.WireBoundBytesPerStep
	r.MaxShareOverMean = MaxOverMean(r.ShardRequestShare)
	r.MeetsBalanceGoal = r.MaxShareOverMean > 0 && r.MaxShareOverMean <= BalanceGoal
	r.Efficiency = ratio(r.SamplesPerSecond, float64(max(p.Cores, 1))*ceil)
	r.MeetsSpeedGoal = r.Efficiency >= SpeedGoal
	return r
}

// WireBound is the wire goal's bytes per worker step: 1.1 x (unique
// keys x dim x 4 x 2) (rows pulled, gradients pushed) + the dense
// model's parameters pulled and gradients pushed.
func WireBound(uniqueKeys float64, dim, denseParams int) float64 {
	return WireGoal*uniqueKeys*float64(dim)*4*2 + float64(denseParams)*4*2
}

// MaxOverMean is the largest of shares over their mean (0 for none).
func MaxOverMean(shares []float64) float64 {
	var sum, top float64
	for _, s := range shares {
		sum += s
		top = max(top, s)
	}
	if sum == 0 {
		return 0
	}
	return top / (sum / float64(len(shares)))
}

// setDir is the data directory of the plan's set name (its synth-ctr
// directory is inside).
func setDir(p EmbeddingsPlan, name string) string { return filepath.Join(p.DataDir, name) }

// writeSet writes the synthetic set of the plan with each field's
// vocabulary capped at vocabCap (0: the default vocabularies).
func writeSet(p EmbeddingsPlan, name string, vocabCap int) (*ctrdata.Meta, error) {
	c := ctrdata.DefaultConfig()
	c.Seed, c.Train, c.Test = p.Seed, p.Train, p.Test
	if vocabCap > 0 {
		for f, v := range c.Vocab {
			c.Vocab[f] = min(v, vocabCap)
		}
	}
	return ctrdata.Generate(filepath.Join(setDir(p, name), ctrdata.SynthName), c)
}

// runPlan is one cluster run of the section: its name, its set's (whose
// vocabularies are capped at vocabCap; reuse: written by a run before),
// its tables' pre-filled rows and the flags that sets.
type runPlan struct {
	name, set string
	vocabCap  int
	prefill   int64
	reuse     bool
	extra     []string
}

// embeddingsRun writes a set (unless reused), trains the cluster on it
// for one epoch while scraping it, and measures its training window. It
// also returns the report and the last snapshot (the tables at the end).
func embeddingsRun(ctx context.Context, p EmbeddingsPlan, rp runPlan) (EmbeddingsRun, *report.Report, Snapshot, error) {
	name := rp.name
	run := EmbeddingsRun{Name: name, VocabCap: rp.vocabCap, PrefillRows: rp.prefill, Train: p.Train}
	if !rp.reuse {
		if _, err := writeSet(p, rp.set, rp.vocabCap); err != nil {
			return run, nil, Snapshot{}, err
		}
	}
	scr := &Scraper{PS: p.PS, Workers: p.Workers, Interval: p.Interval, Now: p.Now}
	args := append([]string{"--data-dir", setDir(p, rp.set), "--ps", strconv.Itoa(p.PS), "--workers", strconv.Itoa(p.Workers),
		"--batch", strconv.Itoa(p.Batch), "--epochs", "1", "--eval-every", "0s", "--seed", strconv.FormatUint(p.Seed, 10)}, rp.extra...)
	rep, wall, err := p.Runner.RunWatched(ctx, args, scr.Watch)
	if err != nil {
		return run, nil, Snapshot{}, err
	}
	snaps := scr.Snapshots()
	from, to, err := TrainingWindow(snaps, 0.2)
	if err != nil {
		return run, nil, Snapshot{}, fmt.Errorf("bench: embeddings %s run (%d snapshots): %w", name, len(snaps), err)
	}
	last := snaps[len(snaps)-1]
	run.WallSeconds, run.AUC, run.PlantedAUC = wall.Seconds(), rep.AUC, rep.PlantedAUC
	measureWindow(&run, from, to, last, p.Spec.EmbeddingDim)
	return run, rep, last, nil
}

// measureWindow sets run's figures from the window [from, to] and the
// tables of last.
func measureWindow(run *EmbeddingsRun, from, to, last Snapshot, dim int) {
	steps := to.WorkerSteps - from.WorkerSteps
	secs := to.At.Sub(from.At).Seconds()
	run.MeasuredSteps, run.MeasuredSeconds = steps, secs
	run.StepsPerSecond = ratio(steps, secs)
	run.SamplesPerSecond = ratio(to.WorkerSamples-from.WorkerSamples, secs)
	var rowB, denseB, pushKeys, keys, cpu float64
	perShard := make([]float64, len(to.Shards))
	for s := range to.Shards {
		a, b := from.Shards[s], to.Shards[s]
		rowB += b.RowBytes - a.RowBytes
		denseB += b.DenseBytes - a.DenseBytes
		cpu += b.CPUSeconds - a.CPUSeconds
		pushKeys += b.PushKeys - a.PushKeys
		perShard[s] = (b.PullKeys - a.PullKeys) + (b.PushKeys - a.PushKeys)
		keys += perShard[s]
		run.Rows += int64(last.Shards[s].Rows)
		run.TableBytes += int64(last.Shards[s].TableBytes)
	}
	run.Parameters = run.Rows * int64(dim)
	run.RowBytesPerStep, run.DenseBytesPerStep = ratio(rowB, steps), ratio(denseB, steps)
	run.BytesPerStep = run.RowBytesPerStep + run.DenseBytesPerStep
	run.CPUMsPerStep = 1e3 * ratio(cpu+to.WorkerCPUSeconds-from.WorkerCPUSeconds, steps)
	// Every key a worker pulls it pushes a gradient for; the pushes alone
	// are the workers' (the chief's evaluations pull too).
	run.UniqueKeysPerStep = ratio(pushKeys, steps)
	run.ShardRequestShare = make([]float64, len(perShard))
	for s, k := range perShard {
		run.ShardRequestShare[s] = ratio(k, keys)
	}
}

// ctrMemory is the memory figures of a CTR run: every role's peak RSS,
// a worker's and the chief's against CTRRoleGoalBytes, and each PS's
// against 1.3x its state + 50 MiB, its state being its tables' bytes at
// the last scrape (rows and their optimizer state) and its slice of the
// dense layers with their optimizer's state.
func ctrMemory(rep *report.Report, last Snapshot, spec model.Spec) (*MemoryResult, error) {
	if len(last.Shards) != rep.PS {
		return nil, fmt.Errorf("bench: %d shards scraped, the run had %d", len(last.Shards), rep.PS)
	}
	return memoryGoals{
		role:  CTRRoleGoalBytes,
		ps:    func(st int64) int64 { return int64(ctrPSFactor*float64(st)) + ctrPSAllowance },
		text:  "RSS <= 1.3 x (rows + their optimizer state + dense slice and its state) + 50 MiB",
		extra: func(s int) int64 { return int64(last.Shards[s].TableBytes) },
	}.of(rep, spec)
}

// writeEmbeddingsTable prints the embeddings section.
func writeEmbeddingsTable(tw io.Writer, e *EmbeddingsResult) {
	fmt.Fprintf(tw, "\nembeddings: %d rows (%d parameters of dimension %d) and %d dense parameters\n", e.Rows, e.Parameters, e.EmbeddingDim, e.DenseParameters)
	fmt.Fprintf(tw, "  wire: %.0f bytes/step for %.0f unique keys; bound %.0f (1.1 x keys x D x 8 + dense x 8): %.3f of it, goal met: %v\n",
		e.BytesPerStep, e.UniqueKeysPerStep, e.WireBoundBytesPerStep, e.BytesOverBound, e.MeetsWireGoal)
	fmt.Fprintf(tw, "  balance: shard request shares %.3f, largest / mean %.3f (goal <= %.2f: %v)\n", e.ShardRequestShare, e.MaxShareOverMean, BalanceGoal, e.MeetsBalanceGoal)
	fmt.Fprintf(tw, "  speed: %.0f samples/s vs %d cores x %.0f in one process: efficiency %.2f (goal >= %.1f: %v)\n",
		e.SamplesPerSecond, e.Cores, e.CeilingSamplesPerSecond, e.Efficiency, SpeedGoal, e.MeetsSpeedGoal)
	s := e.Scale
	fmt.Fprintf(tw, "  scale: %d parameters (%d rows a table pre-filled) at %.1f steps/s vs %d at %.1f: ratio %.2f (goal >= %.1f: %v); CPU per step %.1f vs %.1f ms: %.2f\n",
		s.LargeParameters, s.LargePrefillRows, s.LargeStepsPerSecond, s.SmallParameters, s.SmallStepsPerSecond, s.Ratio, ScaleGoal, s.MeetsGoal,
		s.LargeCPUMsPerStep, s.SmallCPUMsPerStep, s.CPURatio)
	writeScaleMemory(tw, s)
	fmt.Fprintln(tw, "  run\tvocab cap\tprefill/table\trows\tsteps/s\tsamples/s\tunique keys/step\trow bytes/step\tdense bytes/step\tauc (planted)")
	for _, r := range e.Runs {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.4f (%.4f)\n", r.Name, r.VocabCap, r.PrefillRows, r.Rows, r.StepsPerSecond,
			r.SamplesPerSecond, r.UniqueKeysPerStep, r.RowBytesPerStep, r.DenseBytesPerStep, r.AUC, r.PlantedAUC)
	}
}

// writeScaleMemory prints the large tables' run's memory against its
// goals.
func writeScaleMemory(tw io.Writer, s EmbeddingsScale) {
	m := s.Memory
	if m == nil {
		return
	}
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(tw, "  scale memory: worker peak RSS %.0f MiB (goal <= %.0f: %v)", mib(m.Roles.Worker.PeakRSSBytes), mib(CTRRoleGoalBytes), s.MeetsWorkerMemoryGoal)
	for _, sh := range m.Shards {
		fmt.Fprintf(tw, "; %s %.0f MiB for %.0f MiB of state (goal <= %.0f: %v)", sh.Task, mib(sh.PeakRSSBytes), mib(sh.StateBytes), mib(sh.GoalBytes), sh.MeetsGoal)
	}
	fmt.Fprintln(tw)
}
