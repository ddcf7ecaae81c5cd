package bottleneck

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/pstrain/pstrain/observe/metrics"
)

// parse turns a text exposition into Families.
func parse(t *testing.T, text string) metrics.Families {
	t.Helper()
	f, err := metrics.Parse(strings.NewReader(text), expfmt.NewFormat(expfmt.TypeTextPlain))
	if err != nil {
		t.Fatalf("parsing exposition: %v\n%s", err, text)
	}
	return f
}

// proc is the process and host part of every task's exposition.
type proc struct {
	cpu, rss     float64 // process CPU seconds, resident bytes
	load1, cpus  float64 // host
	busy, idle   float64 // host CPU seconds (user, idle); 0,0 leaves them out
	noProcess    bool    // leave out process_* (e.g. a platform without them)
	noHostCPUs   bool    // leave out pstrain_host_cpus
	noHostLoad   bool    // leave out pstrain_host_load1
	extraHistory string  // appended as is
}

func (p proc) text() string {
	var b strings.Builder
	if !p.noProcess {
		fmt.Fprintf(&b, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %g\n", p.cpu)
		fmt.Fprintf(&b, "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %g\n", p.rss)
	}
	if !p.noHostLoad {
		fmt.Fprintf(&b, "# TYPE pstrain_host_load1 gauge\npstrain_host_load1 %g\n", p.load1)
	}
	if !p.noHostCPUs {
		fmt.Fprintf(&b, "# TYPE pstrain_host_cpus gauge\npstrain_host_cpus %g\n", p.cpus)
	}
	if p.busy != 0 || p.idle != 0 {
		fmt.Fprintf(&b, "# TYPE pstrain_host_cpu_seconds_total counter\npstrain_host_cpu_seconds_total{mode=\"user\"} %g\npstrain_host_cpu_seconds_total{mode=\"idle\"} %g\npstrain_host_cpu_seconds_total{mode=\"iowait\"} 0\n", p.busy, p.idle)
	}
	b.WriteString(p.extraHistory)
	return b.String()
}

// hist writes one series of a histogram (a single +Inf bucket suffices for
// the sum and count the breakdown reads).
func hist(name, labels string, sum, count float64) string {
	sep := ""
	if labels != "" {
		sep = ","
	}
	return fmt.Sprintf("%s_bucket{%s%sle=\"+Inf\"} %g\n%s_sum{%s} %g\n%s_count{%s} %g\n",
		name, labels, sep, count, name, labels, sum, name, labels, count)
}

// workerText is a worker's exposition: steps, and per-phase sum/count.
func workerText(p proc, steps, pull, compute, push float64) string {
	var b strings.Builder
	b.WriteString(p.text())
	fmt.Fprintf(&b, "# TYPE pstrain_worker_steps_total counter\npstrain_worker_steps_total %g\n", steps)
	fmt.Fprintf(&b, "# TYPE pstrain_worker_samples_total counter\npstrain_worker_samples_total %g\n", 128*steps)
	b.WriteString("# TYPE pstrain_worker_step_phase_seconds histogram\n")
	b.WriteString(hist("pstrain_worker_step_phase_seconds", `phase="pull"`, pull, steps))
	b.WriteString(hist("pstrain_worker_step_phase_seconds", `phase="compute"`, compute, steps))
	b.WriteString(hist("pstrain_worker_step_phase_seconds", `phase="push"`, push, steps))
	b.WriteString(hist("pstrain_worker_step_phase_seconds", `phase="wait"`, 0, 0))
	return b.String()
}

// psText is a PS's exposition: the barrier wait histogram.
func psText(p proc, barrierSum, barrierCount float64) string {
	return p.text() + "# TYPE pstrain_sync_barrier_wait_seconds histogram\n" +
		hist("pstrain_sync_barrier_wait_seconds", "", barrierSum, barrierCount)
}

func chiefText(p proc) string {
	return p.text() + "# TYPE pstrain_eval_accuracy_ratio gauge\npstrain_eval_accuracy_ratio 0.9\n"
}

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func target(task string) Target {
	return Target{Task: task, URL: "http://127.0.0.1:9400/metrics"}
}

func up(t *testing.T, task, text string) TaskSample {
	return TaskSample{Target: target(task), Up: true, Reading: Extract(parse(t, text))}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// A sync cluster over 10 s: each worker did 100 steps of 0.1 s: compute
// 0.04, push 0.03, pull 0.03 of which the shards held each pull 0.01 s at the
// barrier.
func syncCluster(t *testing.T, load float64) (Snapshot, Snapshot) {
	t.Helper()
	host := proc{cpus: 2, load1: load}
	before := Snapshot{Time: t0, Tasks: []TaskSample{
		up(t, "worker/1", workerText(withCPU(host, 10, 400e6), 50, 1, 2, 1)),
		up(t, "chief", chiefText(withCPU(host, 1, 300e6))),
		up(t, "ps/0", psText(withCPU(host, 5, 60e6), 0.5, 50)),
		up(t, "ps/1", psText(withCPU(host, 5, 60e6), 0.5, 50)),
		up(t, "worker/0", workerText(withCPU(host, 10, 400e6), 50, 1, 2, 1)),
	}}
	after := Snapshot{Time: t0.Add(10 * time.Second), Tasks: []TaskSample{
		up(t, "worker/1", workerText(withCPU(host, 16, 410e6), 150, 4, 6, 4)),
		up(t, "chief", chiefText(withCPU(host, 1.5, 300e6))),
		up(t, "ps/0", psText(withCPU(host, 14.7, 61e6), 2.5, 250)),
		up(t, "ps/1", psText(withCPU(host, 8, 61e6), 2.5, 250)),
		up(t, "worker/0", workerText(withCPU(host, 16, 420e6), 150, 4, 6, 4)),
	}}
	return before, after
}

func withCPU(p proc, cpu, rss float64) proc {
	p.cpu, p.rss = cpu, rss
	return p
}

func TestComputeSyncCluster(t *testing.T) {
	before, after := syncCluster(t, 4.8)
	b, err := Compute([]Snapshot{before, after}, 8)
	if err != nil {
		t.Fatal(err)
	}
	if b.WindowSeconds != 10 {
		t.Errorf("WindowSeconds = %v, want 10", b.WindowSeconds)
	}
	if !near(b.StepsPerSecond, 20) || !near(b.SamplesPerSecond, 20*128) {
		t.Errorf("StepsPerSecond, SamplesPerSecond = %v, %v; want 20, 2560", b.StepsPerSecond, b.SamplesPerSecond)
	}
	want := Phases{Compute: 0.4, Push: 0.3, Pull: 0.2, BarrierWait: 0.1}
	if p := b.Phases; p == nil || !near(p.Compute, want.Compute) || !near(p.Push, want.Push) || !near(p.Pull, want.Pull) || !near(p.BarrierWait, want.BarrierWait) || p.Wait != 0 {
		t.Errorf("Phases = %+v, want %+v", b.Phases, want)
	}
	if b.BarrierWaitPerPullSeconds == nil || !near(*b.BarrierWaitPerPullSeconds, 0.01) {
		t.Errorf("BarrierWaitPerPullSeconds = %v, want 0.01", b.BarrierWaitPerPullSeconds)
	}
	var names []string
	for _, tk := range b.Tasks {
		names = append(names, tk.Task+":"+tk.Role)
	}
	if got := strings.Join(names, " "); got != "chief:chief ps/0:ps ps/1:ps worker/0:worker worker/1:worker" {
		t.Errorf("tasks = %s", got)
	}
	ps0 := b.Tasks[1]
	if ps0.CPUPercent == nil || !near(*ps0.CPUPercent, 97) || ps0.RSSBytes == nil || *ps0.RSSBytes != 61e6 || !ps0.Up {
		t.Errorf("ps/0 = %+v (cpu %v), want 97%% CPU, RSS 61e6, up", ps0, ps0.CPUPercent)
	}
	w0 := b.Tasks[3]
	if !near(w0.StepsPerSecond, 10) || !near(w0.StepSeconds, 0.1) || w0.Phases == nil || !near(w0.Phases.Compute, 0.4) {
		t.Errorf("worker/0 = %+v", w0)
	}
	if b.Busiest != "ps/0" {
		t.Errorf("Busiest = %q, want ps/0", b.Busiest)
	}
	// The host reports 2 CPUs, which beats the 8 passed in.
	if len(b.Hosts) != 1 || b.Hosts[0].Cores != 2 || b.Hosts[0].Load1 != 4.8 || b.Hosts[0].Host != "127.0.0.1" {
		t.Errorf("Hosts = %+v", b.Hosts)
	}
	if b.Verdict != VerdictCPU {
		t.Errorf("Verdict = %q (%s), want %q", b.Verdict, b.Reason, VerdictCPU)
	}
	const line = "step time: compute 40%, push 30%, pull 20%, barrier wait 10%; ps/0 at 97% CPU; load 4.8 on 2 cores (CPU-bound)"
	if got := b.String(); got != line {
		t.Errorf("String =\n%s\nwant\n%s", got, line)
	}
	// The report carries it as JSON; NaN or Inf would make that fail.
	buf, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(buf), `"verdict":"CPU-bound"`) || !strings.Contains(string(buf), `"barrier_wait":0.1`) {
		t.Errorf("JSON lacks verdict or barrier_wait: %s", buf)
	}
}

// TestVerdicts varies one measurement at a time from a quiet baseline.
func TestVerdicts(t *testing.T) {
	type w struct{ pull, compute, push float64 } // seconds over the window, 100 steps
	cases := []struct {
		name        string
		load        float64
		busy, idle  float64 // host CPU seconds over the window
		psCPU       float64 // ps/0 CPU seconds over the 10 s window
		barrier     float64 // barrier sum over 100 pulls
		steps       float64
		worker      w
		wantVerdict string
		wantReason  string
	}{
		{name: "compute", load: 0.5, psCPU: 1, barrier: 0.5, steps: 100, worker: w{2, 7, 1}, wantVerdict: VerdictCompute, wantReason: "compute is 70%"},
		{name: "load saturates", load: 2.0, psCPU: 1, barrier: 0.5, steps: 100, worker: w{2, 7, 1}, wantVerdict: VerdictCPU, wantReason: "load 2.0 on 2 cores"},
		{name: "busy CPUs", load: 0.5, busy: 19, idle: 1, psCPU: 1, barrier: 0.5, steps: 100, worker: w{2, 7, 1}, wantVerdict: VerdictCPU, wantReason: "busy 95%"},
		{name: "hot PS", load: 0.5, psCPU: 9.5, barrier: 0.5, steps: 100, worker: w{2, 7, 1}, wantVerdict: VerdictNetworkPS, wantReason: "ps/0 uses 95%"},
		{name: "barrier", load: 0.5, psCPU: 1, barrier: 4, steps: 100, worker: w{5, 4, 1}, wantVerdict: VerdictBarrier, wantReason: "barrier wait is 40%"},
		{name: "transfers", load: 0.5, psCPU: 1, barrier: 0, steps: 100, worker: w{4, 4, 2}, wantVerdict: VerdictNetworkPS, wantReason: "transfers are 60%"},
		{name: "balanced", load: 0.5, psCPU: 1, barrier: 2.5, steps: 100, worker: w{4.5, 4, 1.5}, wantVerdict: VerdictBalanced, wantReason: "no part"},
		{name: "zero deltas", load: 3, psCPU: 1, barrier: 0, steps: 0, worker: w{0, 0, 0}, wantVerdict: VerdictIdle, wantReason: "no worker"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			host := proc{cpus: 2, load1: c.load}
			h0, h1 := host, host
			h0.busy, h0.idle = 100, 100
			if c.busy != 0 || c.idle != 0 {
				h1.busy, h1.idle = 100+c.busy, 100+c.idle
			} else {
				h0.busy, h0.idle = 0, 0
			}
			snaps := []Snapshot{
				{Time: t0, Tasks: []TaskSample{
					up(t, "ps/0", psText(withCPU(h0, 10, 1), 0, 0)),
					up(t, "worker/0", workerText(withCPU(h0, 10, 1), 0, 0, 0, 0)),
				}},
				{Time: t0.Add(10 * time.Second), Tasks: []TaskSample{
					up(t, "ps/0", psText(withCPU(h1, 10+c.psCPU, 1), c.barrier, c.steps)),
					up(t, "worker/0", workerText(withCPU(h1, 15, 1), c.steps, c.worker.pull, c.worker.compute, c.worker.push)),
				}},
			}
			b, err := Compute(snaps, 2)
			if err != nil {
				t.Fatal(err)
			}
			if b.Verdict != c.wantVerdict || !strings.Contains(b.Reason, c.wantReason) {
				t.Errorf("verdict %q (%s), want %q (containing %q); %s", b.Verdict, b.Reason, c.wantVerdict, c.wantReason, b)
			}
		})
	}
}

func TestComputeCounterReset(t *testing.T) {
	host := proc{cpus: 2, load1: 0.1}
	// worker/0 restarts between the second and third snapshot: its counters
	// fall back and count again from zero.
	snaps := []Snapshot{
		{Time: t0, Tasks: []TaskSample{up(t, "worker/0", workerText(withCPU(host, 100, 1), 1000, 10, 70, 20))}},
		{Time: t0.Add(5 * time.Second), Tasks: []TaskSample{up(t, "worker/0", workerText(withCPU(host, 104, 1), 1050, 10.5, 73.5, 21))}},
		{Time: t0.Add(10 * time.Second), Tasks: []TaskSample{up(t, "worker/0", workerText(withCPU(host, 4, 1), 50, 0.5, 3.5, 1))}},
	}
	b, err := Compute(snaps, 2)
	if err != nil {
		t.Fatal(err)
	}
	w := b.Tasks[0]
	if !near(w.StepsPerSecond, 10) {
		t.Errorf("steps/s = %v, want (50+50)/10 = 10", w.StepsPerSecond)
	}
	if w.CPUPercent == nil || !near(*w.CPUPercent, 80) {
		t.Errorf("CPU = %v, want (4+4)/10 = 80%%", w.CPUPercent)
	}
	if w.Phases == nil || !near(w.Phases.Compute, 0.7) || !near(w.Phases.Pull, 0.1) || !near(w.Phases.Push, 0.2) {
		t.Errorf("phases = %+v, want compute 0.7, pull 0.1, push 0.2", w.Phases)
	}
	// Whole-window deltas would be negative without reset handling.
	if b.Verdict != VerdictCompute {
		t.Errorf("verdict = %s (%s)", b.Verdict, b.Reason)
	}
}

func TestComputeMissingMetricsAndDownTasks(t *testing.T) {
	bare := proc{noProcess: true, noHostCPUs: true, noHostLoad: true}
	snaps := []Snapshot{
		{Time: t0, Tasks: []TaskSample{
			up(t, "worker/0", workerText(bare, 0, 0, 0, 0)),
			{Target: target("ps/0"), Err: "connection refused"},
		}},
		{Time: t0.Add(2 * time.Second), Tasks: []TaskSample{
			up(t, "worker/0", workerText(bare, 10, 0.4, 1.2, 0.4)),
			{Target: target("ps/0"), Err: "connection refused"},
		}},
	}
	b, err := Compute(snaps, 3)
	if err != nil {
		t.Fatal(err)
	}
	ps, w := b.Tasks[0], b.Tasks[1]
	if w.CPUPercent != nil || w.RSSBytes != nil {
		t.Errorf("worker CPU/RSS = %v/%v, want nil without process metrics", w.CPUPercent, w.RSSBytes)
	}
	if ps.Up || ps.Error != "connection refused" || ps.Role != RolePS {
		t.Errorf("ps/0 = %+v, want down with its error and role from its name", ps)
	}
	if b.BarrierWaitPerPullSeconds != nil || b.Phases.BarrierWait != 0 || !near(b.Phases.Pull, 0.2) {
		t.Errorf("barrier %v, phases %+v: without PS data the whole pull is pull", b.BarrierWaitPerPullSeconds, b.Phases)
	}
	// No host gauges: the cores passed in, load 0.
	if len(b.Hosts) != 1 || b.Hosts[0].Cores != 3 || b.Hosts[0].Load1 != 0 || b.Hosts[0].BusyFraction != nil {
		t.Errorf("Hosts = %+v", b.Hosts)
	}
	if b.Busiest != "" {
		t.Errorf("Busiest = %q without CPU data", b.Busiest)
	}
	const line = "step time: compute 60%, push 20%, pull 20%; load 0.0 on 3 cores (compute-bound)"
	if got := b.String(); got != line {
		t.Errorf("String =\n%s\nwant\n%s", got, line)
	}
}

func TestComputeEmptyScrape(t *testing.T) {
	// A target that answers with nothing pstrain knows: no role, no figures.
	snaps := []Snapshot{
		{Time: t0, Tasks: []TaskSample{up(t, "thing", "# TYPE x counter\nx 1\n")}},
		{Time: t0.Add(time.Second), Tasks: []TaskSample{up(t, "thing", "# TYPE x counter\nx 2\n")}},
	}
	b, err := Compute(snaps, 2)
	if err != nil {
		t.Fatal(err)
	}
	if b.Verdict != VerdictIdle || b.Phases != nil || b.Tasks[0].Role != "" {
		t.Errorf("breakdown = %+v", b)
	}
	if got, want := b.String(), "step time: no steps; load 0.0 on 2 cores (idle)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

func TestComputeErrors(t *testing.T) {
	s := Snapshot{Time: t0}
	cases := []struct {
		name  string
		snaps []Snapshot
		cores int
		want  string
	}{
		{"none", nil, 2, "at least two"},
		{"one", []Snapshot{s}, 2, "at least two"},
		{"zero span", []Snapshot{s, s}, 2, "span a positive time"},
		{"out of order", []Snapshot{s, {Time: t0.Add(-time.Second)}, {Time: t0.Add(time.Second)}}, 2, "earlier than"},
		{"no cores", []Snapshot{s, {Time: t0.Add(time.Second)}}, 0, "cores must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Compute(c.snaps, c.cores)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := Compute(nil, 2); !errors.Is(err, ErrTooFewSnapshots) {
		t.Errorf("err = %v, want ErrTooFewSnapshots", err)
	}
}

func TestRoundTo100(t *testing.T) {
	cases := [][]float64{
		{1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0},
		{0.415, 0.325, 0.19, 0.07, 0},
		{0.996, 0.001, 0.001, 0.001, 0.001},
		{0.2, 0.2, 0.2, 0.2, 0.2},
	}
	for _, fs := range cases {
		got := roundTo100(fs)
		sum := 0
		for i, p := range got {
			sum += p
			if math.Abs(float64(p)-100*fs[i]) >= 1 {
				t.Errorf("roundTo100(%v) = %v: %d is 1 or more from %g", fs, got, p, 100*fs[i])
			}
		}
		if sum != 100 {
			t.Errorf("roundTo100(%v) = %v, sums to %d", fs, got, sum)
		}
	}
}

func TestExtractRole(t *testing.T) {
	cases := map[string]string{
		workerText(proc{}, 1, 1, 1, 1): RoleWorker,
		psText(proc{}, 1, 1):           RolePS,
		chiefText(proc{}):              RoleChief,
		proc{}.text():                  "",
	}
	for text, want := range cases {
		if got := Extract(parse(t, text)).Role; got != want {
			t.Errorf("role = %q, want %q for\n%s", got, want, text)
		}
	}
}

func TestExtractReplica(t *testing.T) {
	text := psText(proc{}, 1, 1) + `# TYPE pstrain_ps_replica_role gauge
pstrain_ps_replica_role{role="primary"} 0
pstrain_ps_replica_role{role="standby"} 1
pstrain_ps_replica_role{role="none"} 0
`
	if got := Extract(parse(t, text)).Replica; got != "standby" {
		t.Errorf("replica = %q, want standby", got)
	}
	if got := Extract(parse(t, psText(proc{}, 1, 1))).Replica; got != "" {
		t.Errorf("replica of a PS without the series = %q, want none", got)
	}
}

func TestCompareTasks(t *testing.T) {
	names := []string{"worker/10", "other", "ps/1", "worker/2", "chief", "ps/0"}
	slicesSort(names)
	if got, want := strings.Join(names, " "), "chief ps/0 ps/1 worker/2 worker/10 other"; got != want {
		t.Errorf("order = %s, want %s", got, want)
	}
}

func slicesSort(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && compareTasks(s[j-1], s[j]) > 0; j-- {
			s[j-1], s[j] = s[j], s[j-1]
		}
	}
}
