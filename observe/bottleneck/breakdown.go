package bottleneck

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pstrain/pstrain/observe/metrics"
)

// Verdicts, the values of [Breakdown.Verdict].
const (
	// VerdictIdle: no worker completed a step in the window.
	VerdictIdle = "idle"
	// VerdictCPU: a host has no spare CPU; every phase is slowed by
	// processes queueing for a core, so adding work (workers, shards) to
	// this host will not make training faster.
	VerdictCPU = "CPU-bound"
	// VerdictNetworkPS: the workers spend most of the step moving parameters
	// and gradients, or a parameter server is saturated.
	VerdictNetworkPS = "network/PS-bound"
	// VerdictBarrier: the workers spend much of the step waiting at the sync
	// barrier for the slowest worker's gradient; or a straggler (see
	// FindStragglers) holds the others back: their pulls wait for its
	// gradients (sync) or for it to catch up (SSP).
	VerdictBarrier = "straggler/barrier-bound"
	// VerdictCompute: most of the step is forward and backward passes, as it
	// should be; faster math or more cores would help.
	VerdictCompute = "compute-bound"
	// VerdictBalanced: no single part dominates.
	VerdictBalanced = "balanced"
)

// Thresholds of the verdict. They are checked in the order listed; the first
// that holds names the bottleneck. Before them all, a straggler that holds
// the others back (heldBack) names it.
const (
	// SaturatedLoadPerCore: a host whose 1-minute load average per core is at
	// least this has, on average, a runnable thread for every core, so
	// threads queue for CPU.
	SaturatedLoadPerCore = 1.0
	// SaturatedBusyFraction: a host whose CPUs were busy (not idle or
	// waiting for I/O) at least this fraction of the window has no spare
	// CPU. This catches saturation sooner than the slowly moving load1.
	SaturatedBusyFraction = 0.90
	// HotPSPercent: a parameter server using at least this much of one core
	// serves every worker's pulls and pushes late; it is the bottleneck even
	// when the host has spare cores (its update loop runs under one lock).
	HotPSPercent = 90.0
	// BarrierFraction: workers that spend at least this share of the step at
	// the sync barrier are held back by the slowest worker.
	BarrierFraction = 0.30
	// TransferFraction: workers that spend at least this share of the step in
	// pull and push transfers (barrier wait excluded) are limited by the
	// network or the parameter servers.
	TransferFraction = 0.50
	// ComputeFraction: workers that spend at least this share of the step in
	// forward and backward passes are limited by compute.
	ComputeFraction = 0.50
)

// TaskSample is one task at one instant: whether its scrape succeeded and
// what it read.
type TaskSample struct {
	Target  Target
	Up      bool
	Err     string // why the scrape failed, when !Up
	Reading Reading
}

// Snapshot is every task at one instant.
type Snapshot struct {
	Time  time.Time
	Tasks []TaskSample
}

// Phases are shares of the workers' step time, between 0 and 1, adding up to
// 1 (when any step time was measured).
//
// The worker's pull phase lasts from sending its pulls to all shards until
// the last reply. In sync mode a shard holds a pull until the parameter
// version the worker needs exists, i.e. until every gradient of the previous
// step has arrived: that hold is the barrier wait, measured on the parameter
// servers (pstrain_sync_barrier_wait_seconds, one observation per pull
// request). So the pull phase is split into BarrierWait (the mean hold per
// pull request on the shards, times the worker's pulls, capped at its pull
// time) and Pull (the rest: serialising, sending and receiving the
// parameters). Shards are pulled in parallel, so one pull's hold is counted
// once, not once per shard. The barrier metric has no worker label: each
// worker is charged the cluster-wide mean, which under-states the wait of
// fast workers and over-states that of the straggler.
type Phases struct {
	Compute     float64 `json:"compute"`      // forward and backward pass
	Push        float64 `json:"push"`         // sending gradients to all shards
	Pull        float64 `json:"pull"`         // fetching parameters, barrier wait excluded
	BarrierWait float64 `json:"barrier_wait"` // held at the shards waiting for the other workers
	Wait        float64 `json:"wait"`         // the worker's own wait phase (staleness bound), if it reports one
}

// Task is one task's figures over the window.
type Task struct {
	Task string `json:"task"`
	Role string `json:"role"`
	Host string `json:"host"`
	Up   bool   `json:"up"` // the last scrape succeeded
	// Replica is a PS process's replica role at the last scrape
	// (primary, standby, deposed, none; docs/replication.md).
	Replica string `json:"replica,omitempty"`
	Error   string `json:"error,omitempty"`
	// CPUPercent is the task's CPU time over the window as a percentage of
	// one core (200 = two cores busy). Nil when not measured.
	CPUPercent *float64 `json:"cpu_percent,omitempty"`
	// RSSBytes is the resident memory at the last successful scrape.
	RSSBytes *float64 `json:"rss_bytes,omitempty"`
	// Parameters is a PS's parameters at the last successful scrape
	// (pstrain_ps_shard_parameters): its share of the layout, uneven
	// after a rebalance (docs/elastic.md, "Rebalancing").
	Parameters *float64 `json:"parameters,omitempty"`
	// StepsPerSecond is the worker's step rate over the window.
	StepsPerSecond float64 `json:"steps_per_second,omitempty"`
	// StepSeconds is the worker's mean step time.
	StepSeconds float64 `json:"mean_step_seconds,omitempty"`
	// Phases is the worker's step-time breakdown; nil for other roles and
	// for a worker without steps in the window.
	Phases *Phases `json:"phases,omitempty"`
}

// Host is one machine's CPU state; tasks are grouped by their URL's host.
type Host struct {
	Host  string  `json:"host"`
	Load1 float64 `json:"load1"`
	Cores int     `json:"cores"`
	// BusyFraction is the share of the host's CPU time over the window that
	// was not idle or I/O wait; nil when not measured.
	BusyFraction *float64 `json:"busy_fraction,omitempty"`
}

// Breakdown says where the step time went over a window and what limits
// training.
type Breakdown struct {
	WindowSeconds float64 `json:"window_seconds"`
	// StepsPerSecond sums the workers' step rates (in sync mode, workers x
	// global steps/s).
	StepsPerSecond   float64 `json:"steps_per_second"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// Phases is the step-time breakdown of all workers together, weighted
	// by time; nil when no worker measured a step.
	Phases *Phases `json:"phases,omitempty"`
	// BarrierWaitPerPullSeconds is the mean hold of a pull request at the
	// sync barrier over all shards; nil when no shard reported one.
	BarrierWaitPerPullSeconds *float64 `json:"barrier_wait_per_pull_seconds,omitempty"`
	Tasks                     []Task   `json:"tasks"`
	Hosts                     []Host   `json:"hosts"`
	// Busiest is the task using the most CPU, "" if none was measured.
	Busiest string `json:"busiest_task,omitempty"`
	// Stragglers are the workers slower than the others over the window,
	// slowest first (FindStragglers).
	Stragglers []Straggler `json:"stragglers,omitempty"`
	// Verdict is one of the Verdict constants; Reason is the measurement
	// that decided it.
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
}

// ErrTooFewSnapshots is returned by [Compute] when it has fewer than two
// snapshots to compare.
var ErrTooFewSnapshots = errors.New("bottleneck: need at least two snapshots")

// taskState accumulates one task over the snapshots.
type taskState struct {
	target  Target
	role    string
	last    *Reading
	replica string
	inc     map[string]float64 // increase of each counter seen in two readings
	up      bool
	err     string
	gauges  map[string]float64 // latest value of each gauge
	// slices are a worker's figures between consecutive readings, by
	// the index of the later snapshot (the straggler rule's slices).
	slices map[int]WorkerTime
}

// Compute returns the breakdown over snaps, which must be in time order and
// span a positive time; the window is from the first to the last. cores is
// the number of CPUs of a host that does not report pstrain_host_cpus
// (normally runtime.NumCPU()); it must be positive.
//
// Counters increase between consecutive successful readings of a task; a
// value below the previous one is a restart and counts from zero. A task
// down in some snapshots contributes what it did while up.
func Compute(snaps []Snapshot, cores int) (Breakdown, error) {
	window, err := checkSnapshots(snaps, cores)
	if err != nil {
		return Breakdown{}, err
	}
	order := accumulate(snaps)
	b := Breakdown{WindowSeconds: window}
	meanBarrier, ok := meanBarrierWait(order)
	if ok {
		b.BarrierWaitPerPullSeconds = &meanBarrier
	}
	var all Phases // summed seconds over workers
	var allTotal float64
	for _, st := range order {
		t, secs := st.task(window, meanBarrier)
		b.StepsPerSecond += t.StepsPerSecond
		b.SamplesPerSecond += st.inc[keySamples] / window
		if total := secs.total(); total > 0 {
			all = all.plus(secs)
			allTotal += total
		}
		b.Tasks = append(b.Tasks, t)
	}
	if allTotal > 0 {
		f := all.scaled(1 / allTotal)
		b.Phases = &f
	}
	b.Hosts = hosts(order, cores)
	b.Busiest = busiest(b.Tasks)
	b.Stragglers = FindStragglers(workerTimes(order))
	b.Verdict, b.Reason = verdict(b)
	return b, nil
}

// checkSnapshots validates Compute's arguments and returns the window in
// seconds.
func checkSnapshots(snaps []Snapshot, cores int) (float64, error) {
	if len(snaps) < 2 {
		return 0, ErrTooFewSnapshots
	}
	if cores < 1 {
		return 0, fmt.Errorf("bottleneck: cores must be positive, got %d", cores)
	}
	window := snaps[len(snaps)-1].Time.Sub(snaps[0].Time).Seconds()
	if !(window > 0) {
		return 0, fmt.Errorf("bottleneck: snapshots span %gs; they must be in time order and span a positive time", window)
	}
	for i := 1; i < len(snaps); i++ {
		if snaps[i].Time.Before(snaps[i-1].Time) {
			return 0, fmt.Errorf("bottleneck: snapshot %d (%s) is earlier than snapshot %d (%s)", i, snaps[i].Time, i-1, snaps[i-1].Time)
		}
	}
	return window, nil
}

// accumulate folds the snapshots into one state per task, in task order.
func accumulate(snaps []Snapshot) []*taskState {
	var order []*taskState
	states := map[string]*taskState{}
	for i, snap := range snaps {
		last := i == len(snaps)-1
		for _, ts := range snap.Tasks {
			st, ok := states[ts.Target.Task]
			if !ok {
				st = &taskState{target: ts.Target, role: ts.Target.role(), inc: map[string]float64{}, gauges: map[string]float64{}, slices: map[int]WorkerTime{}}
				states[ts.Target.Task] = st
				order = append(order, st)
			}
			st.observe(i, ts, last)
		}
	}
	slices.SortStableFunc(order, func(a, b *taskState) int { return compareTasks(a.target.Task, b.target.Task) })
	return order
}

// observe folds one sample of the task, from snapshot i, into its state;
// last says whether it is from the last snapshot, which decides whether
// the task is up.
func (st *taskState) observe(i int, ts TaskSample, last bool) {
	if last {
		st.up, st.err = ts.Up, ts.Err
	}
	if !ts.Up {
		return
	}
	r := ts.Reading
	if st.role == "" {
		st.role = r.Role
	}
	st.replica = r.Replica
	if st.last != nil {
		for k, v := range r.Counters {
			if prev, ok := st.last.Counters[k]; ok {
				st.inc[k] += increase(prev, v)
			}
		}
		st.slices[i] = ownTime(st.target.Task, *st.last, r)
	}
	st.last = &r
	for k, v := range r.Gauges {
		st.gauges[k] = v
	}
}

// meanBarrierWait is the mean hold of a pull request at the sync barrier
// over all shards; false when no shard reported one.
func meanBarrierWait(order []*taskState) (float64, bool) {
	var sum, count float64
	for _, st := range order {
		sum += st.inc[keyBarrierSum]
		count += st.inc[keyBarrierCount]
	}
	if count > 0 {
		return sum / count, true
	}
	return 0, false
}

// task is the task's line of the breakdown over a window of the given
// seconds, and its step phases in seconds (zero for a task without steps).
// meanBarrier is the mean barrier hold per pull, carved out of its pulls.
func (st *taskState) task(window, meanBarrier float64) (Task, Phases) {
	t := Task{Task: st.target.Task, Role: st.role, Host: st.target.Host(), Up: st.up, Error: st.err, Replica: st.replica}
	if v, ok := st.inc[keyCPU]; ok {
		p := 100 * v / window
		t.CPUPercent = &p
	}
	if v, ok := st.gauges[keyRSS]; ok {
		t.RSSBytes = &v
	}
	if v, ok := st.gauges[keyShardParams]; ok && st.role == RolePS {
		t.Parameters = &v
	}
	t.StepsPerSecond = st.inc[keySteps] / window

	secs := Phases{
		Compute: st.inc[keyPhaseSum+metrics.PhaseCompute],
		Push:    st.inc[keyPhaseSum+metrics.PhasePush],
		Pull:    st.inc[keyPhaseSum+metrics.PhasePull],
		Wait:    st.inc[keyPhaseSum+metrics.PhaseWait],
	}
	secs.BarrierWait = math.Min(meanBarrier*st.inc[keyPhaseCount+metrics.PhasePull], secs.Pull)
	secs.Pull -= secs.BarrierWait
	if total := secs.total(); total > 0 {
		f := secs.scaled(1 / total)
		t.Phases = &f
		if n := st.inc[keyPhaseCount+metrics.PhaseCompute]; n > 0 {
			t.StepSeconds = total / n
		}
	}
	return t, secs
}

// busiest is the task using the most CPU, "" if none was measured; the
// first in order wins a tie.
func busiest(tasks []Task) string {
	var name string
	var most float64
	for _, t := range tasks {
		if t.CPUPercent != nil && (name == "" || *t.CPUPercent > most) {
			name, most = t.Task, *t.CPUPercent
		}
	}
	return name
}

// increase is a counter's increase from prev to cur, where a decrease means
// the counter restarted from zero.
func increase(prev, cur float64) float64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// hosts groups the tasks' host figures by host, in task order.
func hosts(order []*taskState, cores int) []Host {
	var out []Host
	index := map[string]int{}
	for _, st := range order {
		name := st.target.Host()
		i, ok := index[name]
		if !ok {
			i = len(out)
			index[name] = i
			out = append(out, Host{Host: name, Cores: cores})
		}
		h := &out[i]
		if v, ok := st.gauges[keyLoad1]; ok && v > h.Load1 {
			h.Load1 = v
		}
		if v, ok := st.gauges[keyHostCPUs]; ok && v >= 1 {
			h.Cores = int(v)
		}
		if total := st.inc[keyHostCPUTotal]; h.BusyFraction == nil && total > 0 {
			busy := st.inc[keyHostCPUBusy] / total
			h.BusyFraction = &busy
		}
	}
	return out
}

// verdict applies the thresholds, in order.
func verdict(b Breakdown) (string, string) {
	if b.Phases == nil || b.StepsPerSecond == 0 {
		return VerdictIdle, "no worker completed a step in the window"
	}
	// Before the host's CPU: a worker slower than its peers on the same
	// host is not explained by the host being busy, and it is what the
	// others wait for.
	if share, ok := heldBack(b); ok {
		return VerdictBarrier, fmt.Sprintf("%s; the others spend %.0f%% of their step pulling (at least %.0f%%): they wait for it", b.Stragglers[0], 100*share, 100*BarrierFraction)
	}
	for _, h := range b.Hosts {
		if perCore := h.Load1 / float64(h.Cores); perCore >= SaturatedLoadPerCore {
			return VerdictCPU, fmt.Sprintf("load %.1f on %d cores%s is at least %.1f per core", h.Load1, h.Cores, onHost(b, h), SaturatedLoadPerCore)
		}
		if h.BusyFraction != nil && *h.BusyFraction >= SaturatedBusyFraction {
			return VerdictCPU, fmt.Sprintf("CPUs%s busy %.0f%% of the time (at least %.0f%%)", onHost(b, h), 100**h.BusyFraction, 100*SaturatedBusyFraction)
		}
	}
	for _, t := range b.Tasks {
		if t.Role == RolePS && t.CPUPercent != nil && *t.CPUPercent >= HotPSPercent {
			return VerdictNetworkPS, fmt.Sprintf("%s uses %.0f%% of a core (at least %.0f%%)", t.Task, *t.CPUPercent, HotPSPercent)
		}
	}
	p := b.Phases
	if p.BarrierWait >= BarrierFraction {
		return VerdictBarrier, fmt.Sprintf("barrier wait is %.0f%% of the step (at least %.0f%%)", 100*p.BarrierWait, 100*BarrierFraction)
	}
	if p.Pull+p.Push >= TransferFraction {
		return VerdictNetworkPS, fmt.Sprintf("pull and push transfers are %.0f%% of the step (at least %.0f%%)", 100*(p.Pull+p.Push), 100*TransferFraction)
	}
	if p.Compute >= ComputeFraction {
		return VerdictCompute, fmt.Sprintf("compute is %.0f%% of the step (at least %.0f%%)", 100*p.Compute, 100*ComputeFraction)
	}
	return VerdictBalanced, "no part of the step reaches its threshold"
}

// onHost names h when the breakdown spans several hosts.
func onHost(b Breakdown, h Host) string {
	if len(b.Hosts) < 2 {
		return ""
	}
	return " on " + h.Host
}

// String renders the breakdown on one line, e.g.
//
//	step time: compute 41%, push 33%, pull 19%, barrier wait 7%; ps/0 at 97% CPU; load 4.8 on 2 cores (CPU-bound)
//
// with the stragglers after the step time ("worker/1 is 2.9x slower than
// the others (...)").
//
// The step-time percentages are rounded so that they add up to 100.
func (b Breakdown) String() string {
	var parts []string
	if b.Phases != nil {
		parts = append(parts, "step time: "+b.Phases.String(b.BarrierWaitPerPullSeconds != nil))
	} else {
		parts = append(parts, "step time: no steps")
	}
	for _, s := range b.Stragglers {
		parts = append(parts, s.String())
	}
	for _, t := range b.Tasks {
		if t.Task == b.Busiest && t.CPUPercent != nil {
			parts = append(parts, fmt.Sprintf("%s at %.0f%% CPU", t.Task, *t.CPUPercent))
		}
	}
	if h, ok := b.worstHost(); ok {
		parts = append(parts, fmt.Sprintf("load %.1f on %d cores%s", h.Load1, h.Cores, onHost(b, h)))
	}
	return strings.Join(parts, "; ") + " (" + b.Verdict + ")"
}

// worstHost returns the host with the highest load per core.
func (b Breakdown) worstHost() (Host, bool) {
	var best Host
	found := false
	for _, h := range b.Hosts {
		if !found || h.Load1/float64(h.Cores) > best.Load1/float64(best.Cores) {
			best, found = h, true
		}
	}
	return best, found
}

// String renders the shares as "compute 41%, push 33%, pull 19%, barrier
// wait 7%", leaving out barrier wait when withBarrier is false and wait when
// it is zero. The percentages are rounded to add up to 100.
func (p Phases) String(withBarrier bool) string {
	names := []string{"compute", "push", "pull", "barrier wait", "wait"}
	pct := roundTo100([]float64{p.Compute, p.Push, p.Pull, p.BarrierWait, p.Wait})
	var parts []string
	for i, n := range names {
		if (i == 3 && !withBarrier) || (i == 4 && pct[i] == 0) {
			continue
		}
		parts = append(parts, n+" "+strconv.Itoa(pct[i])+"%")
	}
	return strings.Join(parts, ", ")
}

// roundTo100 rounds fractions (adding up to 1) to whole percentages adding
// up to 100, by the largest remainder method.
func roundTo100(fs []float64) []int {
	out := make([]int, len(fs))
	type rem struct {
		i int
		r float64
	}
	rems := make([]rem, len(fs))
	sum := 0
	for i, f := range fs {
		x := 100 * f
		out[i] = int(math.Floor(x))
		sum += out[i]
		rems[i] = rem{i, x - math.Floor(x)}
	}
	slices.SortStableFunc(rems, func(a, b rem) int { return cmp.Compare(b.r, a.r) })
	for k := 0; sum < 100 && k < len(rems); k++ {
		out[rems[k].i]++
		sum++
	}
	return out
}

func (p Phases) total() float64 { return p.Compute + p.Push + p.Pull + p.BarrierWait + p.Wait }

func (p Phases) scaled(k float64) Phases {
	return Phases{Compute: p.Compute * k, Push: p.Push * k, Pull: p.Pull * k, BarrierWait: p.BarrierWait * k, Wait: p.Wait * k}
}

func (p Phases) plus(q Phases) Phases {
	return Phases{Compute: p.Compute + q.Compute, Push: p.Push + q.Push, Pull: p.Pull + q.Pull, BarrierWait: p.BarrierWait + q.BarrierWait, Wait: p.Wait + q.Wait}
}

// compareTasks orders tasks chief first, then ps/0, ps/1, ..., then workers,
// by numeric index; other names sort last, alphabetically.
func compareTasks(a, b string) int {
	rank := func(s string) (int, int) {
		role, idx, _ := strings.Cut(s, "/")
		r := 3
		switch role {
		case RoleChief:
			r = 0
		case RolePS:
			r = 1
		case RoleWorker:
			r = 2
		}
		n, err := strconv.Atoi(idx)
		if err != nil {
			n = -1
		}
		return r, n
	}
	ra, na := rank(a)
	rb, nb := rank(b)
	if c := cmp.Compare(ra, rb); c != 0 {
		return c
	}
	if c := cmp.Compare(na, nb); c != 0 {
		return c
	}
	return strings.Compare(a, b)
}
