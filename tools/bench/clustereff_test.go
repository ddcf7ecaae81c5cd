package bench

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas/gonum"

	"github.com/pstrain/pstrain/observe/bottleneck"
	"github.com/pstrain/pstrain/observe/report"
)

func TestReportSamples(t *testing.T) {
	sync := &report.Report{Mode: "sync", Batch: 128, ReplicasToAggregate: 2, GlobalSteps: 10}
	async := &report.Report{Mode: "async", Batch: 128, ReplicasToAggregate: 2, GlobalSteps: 10}
	if got := ReportSamples(sync); got != 2560 {
		t.Errorf("sync samples = %d, want 10 steps x 2 replicas x 128", got)
	}
	if got := ReportSamples(async); got != 1280 {
		t.Errorf("async samples = %d, want 10 steps x 128", got)
	}
}

func TestSteadyRate(t *testing.T) {
	short := &report.Report{Mode: "sync", Batch: 100, ReplicasToAggregate: 2, GlobalSteps: 150, TrainSeconds: 3}
	long := &report.Report{Mode: "sync", Batch: 100, ReplicasToAggregate: 2, GlobalSteps: 600, TrainSeconds: 9}
	n, secs, r, err := SteadyRate(short, long)
	// 450 more steps of 200 samples in 6 more seconds.
	if err != nil || n != 90000 || secs != 6 || r != 15000 {
		t.Fatalf("SteadyRate = %d, %v, %v, %v; want 90000, 6, 15000", n, secs, r, err)
	}
	if _, _, _, err := SteadyRate(long, short); err == nil {
		t.Error("a long run shorter than the short one gave a rate")
	}
	same := *long
	same.TrainSeconds = 3
	if _, _, _, err := SteadyRate(short, &same); err == nil {
		t.Error("no extra time gave a rate")
	}
}

func TestEfficiencyAndIdeal(t *testing.T) {
	if got := Efficiency(16000, 2, 32000); got != 0.25 {
		t.Errorf("efficiency = %v, want 16000 / (2 x 32000)", got)
	}
	if got := Efficiency(16000, 2, 0); got != 0 {
		t.Errorf("no ceiling: efficiency %v, want 0", got)
	}
	ttt := 10.0
	ideal, over := TimeToTargetOverIdeal(&ttt, 320000, 2, 32000)
	if ideal != 5 || over == nil || *over != 2 {
		t.Errorf("ideal %v, over %v; want 5 s (320000 / 64000) and 2", ideal, over)
	}
	if ideal, over := TimeToTargetOverIdeal(nil, 320000, 2, 32000); ideal != 5 || over != nil {
		t.Errorf("target not reached: ideal %v, over %v; want 5 and nil", ideal, over)
	}
	if _, over := TimeToTargetOverIdeal(&ttt, 320000, 2, 0); over != nil {
		t.Errorf("no ceiling gave a ratio %v", *over)
	}
}

func TestSamplesToTarget(t *testing.T) {
	ttt := 7.5
	rep := &report.Report{Mode: "sync", Batch: 128, ReplicasToAggregate: 2, GlobalSteps: 1000, TimeToTargetSeconds: &ttt,
		Evals: []report.Eval{{Step: 500, Seconds: 4, TestAccuracy: 0.97}, {Step: 800, Seconds: 7.5, Subset: true},
			{Step: 900, Seconds: 7.5, TestAccuracy: 0.976}, {Step: 1000, Seconds: 9}}}
	if got := SamplesToTarget(rep); got != 900*256 {
		t.Errorf("samples to target = %d, want the full evaluation's step 900 x 256", got)
	}
	rep.TimeToTargetSeconds = nil
	if got := SamplesToTarget(rep); got != 1000*256 {
		t.Errorf("no target: %d, want the whole run's 1000 x 256", got)
	}
}

// clusterRunner answers each run with a report whose steps and train time
// follow from its flags: rate samples/s after one second of start, so the
// steady rate is rate exactly.
type clusterRunner struct {
	calls [][]string
	rate  map[string]float64 // by mode, "sync-r1" with --ps-replicas 1
	fail  string             // fail runs with these flags
}

func (f *clusterRunner) Run(ctx context.Context, args []string) (*report.Report, time.Duration, error) {
	f.calls = append(f.calls, args)
	if f.fail != "" && strings.Contains(strings.Join(args, " "), f.fail) {
		return nil, time.Second, errors.New("task died")
	}
	flag := func(name string) string { i := slices.Index(args, name); return args[i+1] }
	epochs, _ := strconv.ParseFloat(flag("--epochs"), 64)
	workers, _ := strconv.Atoi(flag("--workers"))
	batch, _ := strconv.Atoi(flag("--batch"))
	mode := flag("--mode")
	key := mode
	if slices.Contains(args, "--ps-replicas") {
		key += "-r" + flag("--ps-replicas")
	}
	samples := epochs * 60000
	perStep := batch
	if mode == "sync" {
		perStep *= workers
	}
	steps := int64(samples) / int64(perStep)
	rep := &report.Report{Mode: mode, Batch: batch, ReplicasToAggregate: workers, GlobalSteps: steps,
		TrainSeconds: 1 + float64(steps*int64(perStep))/f.rate[key],
		Bottleneck: &bottleneck.Breakdown{Phases: &bottleneck.Phases{Compute: 0.5, Push: 0.2, Pull: 0.2, BarrierWait: 0.1},
			Tasks: []bottleneck.Task{{Task: "ps/0", CPUPercent: ptrTo(22.0)}, {Task: "chief"}}}}
	return rep, 5 * time.Second, nil
}

func ptrTo(v float64) *float64 { return &v }

func TestClusterSection(t *testing.T) {
	rates := map[string]float64{"sync": 16000, "async": 20000, "sync-r1": 12000, "async-r1": 18000}
	f := &clusterRunner{rate: rates, fail: "--ps 1 "}
	p := ClusterPlan{Setups: ClusterSetups(), Batch: 100, ShortEpochs: 0.5, LongEpochs: 2}
	res, err := Cluster(context.Background(), f, p, 2, 32000)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.calls) != 9 {
		t.Fatalf("%d runs, want a short and a long one per setup, none after a failed short one: %q", len(f.calls), f.calls)
	}
	if want := []string{"--mode", "sync", "--ps", "2", "--workers", "2", "--epochs", "0.5", "--target-accuracy", "0", "--eval-every", "0s", "--batch", "100"}; !slices.Equal(f.calls[0], want) {
		t.Errorf("first run flags %q, want %q", f.calls[0], want)
	}
	if res.Cores != 2 || res.CeilingSamplesPerSecond != 32000 || res.MachineSamplesPerSecond != 64000 || res.Batch != 100 {
		t.Errorf("cluster header = %+v", res)
	}
	if len(res.Runs) != 5 {
		t.Fatalf("runs = %+v", res.Runs)
	}
	if r := res.Runs[3]; r.Name != "sync-2ps-2w-r1" || !near(r.SamplesPerSecond, 12000) || !slices.Contains(f.calls[5], "--ps-replicas") {
		t.Errorf("sync with hot standbys = %+v (flags %q)", r, f.calls[5])
	}
	if x := res.ReplicaThroughput; len(x) != 2 || !near(x["sync-2ps-2w"], 0.75) || !near(x["async-2ps-2w"], 0.9) {
		t.Errorf("replica throughput = %v, want sync 0.75 and async 0.9", x)
	}
	def, async, small := res.Runs[0], res.Runs[1], res.Runs[2]
	// 1.5 epochs measured: 90000 samples (900 sync steps of 2 x 100).
	if def.Name != "sync-2ps-2w" || def.MeasuredSamples != 90000 || !near(def.SamplesPerSecond, 16000) || !near(def.Efficiency, 0.25) ||
		!near(res.Efficiency, def.Efficiency) || def.Phases == nil || def.Phases.Compute != 0.5 || def.TaskCPUPercent["ps/0"] != 22 {
		t.Errorf("default cluster = %+v", def)
	}
	if _, ok := def.TaskCPUPercent["chief"]; ok {
		t.Errorf("a task without a CPU figure got one: %v", def.TaskCPUPercent)
	}
	if async.Name != "async-2ps-2w" || !near(async.SamplesPerSecond, 20000) || !near(async.Efficiency, 0.3125) {
		t.Errorf("async = %+v", async)
	}
	if small.Name != "sync-1ps-1w" || small.Error == "" || small.Efficiency != 0 {
		t.Errorf("failed setup = %+v, want its error recorded", small)
	}

	// The JSON keys are a contract: cluster.efficiency and per-setup rows.
	b, err := json.Marshal(&Result{Cluster: res})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Cluster struct {
			Efficiency *float64 `json:"efficiency"`
			Runs       []struct {
				Name       string   `json:"name"`
				Efficiency *float64 `json:"efficiency"`
			} `json:"runs"`
		} `json:"cluster"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Cluster.Efficiency == nil || !near(*got.Cluster.Efficiency, 0.25) || len(got.Cluster.Runs) != 5 ||
		got.Cluster.Runs[1].Name != "async-2ps-2w" || got.Cluster.Runs[1].Efficiency == nil {
		t.Errorf("JSON: %s", b)
	}

	// The default cluster failing fails the section.
	if _, err := Cluster(context.Background(), &clusterRunner{rate: f.rate, fail: "--mode sync --ps 2 --workers 2 --epochs 0.5"}, p, 2, 32000); err == nil {
		t.Error("a failing default cluster did not fail the section")
	}
	if _, err := Cluster(context.Background(), f, ClusterPlan{Setups: ClusterSetups(), Batch: 100, ShortEpochs: 1, LongEpochs: 1}, 2, 1); err == nil {
		t.Error("a plan without a measured stretch was accepted")
	}
}

func TestRunClusterAndEndToEndRatios(t *testing.T) {
	f := &clusterRunner{rate: map[string]float64{"sync": 16000, "async": 20000, "sync-r1": 12000, "async-r1": 18000}}
	res, err := Run(context.Background(), Config{Sections: []string{SectionCluster}, Quick: true, Spec: mnistMLP,
		Batches: []int{128}, BLAS: gonum.Implementation{}, BLASName: "gonum", Budget: time.Millisecond, Rounds: 1, Runner: f})
	if err != nil || len(res.Errors) > 0 {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	c := res.Cluster
	if c == nil || c.CeilingSamplesPerSecond <= 0 || c.Cores != res.Machine.CPUs || len(c.Runs) != 5 ||
		!near(c.Efficiency, 16000/(float64(c.Cores)*c.CeilingSamplesPerSecond)) {
		t.Fatalf("cluster = %+v", c)
	}
	var sb strings.Builder
	if err := WriteTable(&sb, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "cluster: efficiency") || !strings.Contains(sb.String(), "async-2ps-2w") ||
		!strings.Contains(sb.String(), "sync-2ps-2w keeps 0.75 of its samples/s") {
		t.Errorf("table:\n%s", sb.String())
	}

	// end_to_end: the target run's time to target over its ideal time.
	res, err = Run(context.Background(), Config{Sections: []string{SectionEndToEnd}, Quick: true, Spec: mnistMLP,
		Batches: []int{128}, BLAS: gonum.Implementation{}, BLASName: "gonum", Budget: time.Millisecond, Rounds: 1, Runner: &fakeRunner{}})
	if err != nil || len(res.Errors) > 0 {
		t.Fatalf("Run = %+v, %v", res, err)
	}
	e := res.EndToEnd
	// fakeRunner's target run: 700 sync steps of 2 x 128, target at
	// 9.25 s (no evaluations listed: the whole run's samples).
	if e == nil || e.CeilingSamplesPerSecond <= 0 || e.SamplesToTarget != 700*256 || e.TimeToTargetOverIdeal == nil ||
		!near(e.IdealSeconds, float64(700*256)/(float64(e.Cores)*e.CeilingSamplesPerSecond)) || !near(*e.TimeToTargetOverIdeal, 9.25/e.IdealSeconds) {
		t.Fatalf("end_to_end = %+v", e)
	}
	b, _ := json.Marshal(res)
	if !strings.Contains(string(b), `"time_to_target_over_ideal":`) {
		t.Errorf("JSON lacks end_to_end.time_to_target_over_ideal: %s", b)
	}
}

func TestValidateClusterNeedsRunnerAndBLAS(t *testing.T) {
	base := Config{Sections: []string{SectionCluster}, Spec: mnistMLP, Batches: []int{128}, Budget: time.Millisecond, Rounds: 1}
	if err := base.Validate(); err == nil {
		t.Error("cluster without a runner or a BLAS accepted")
	}
	base.Runner = &clusterRunner{}
	if err := base.Validate(); err == nil || !strings.Contains(err.Error(), "BLAS") {
		t.Errorf("cluster without a BLAS: %v", err)
	}
	base.BLAS = gonum.Implementation{}
	if err := base.Validate(); err != nil {
		t.Error(err)
	}
}
