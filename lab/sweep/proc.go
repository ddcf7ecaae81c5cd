package sweep

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc (USER_HZ, 100 on Linux
// whatever the kernel's tick).
const userHZ = 100

// Evidence is what the sweep measures of one run's own interval, from the
// process that ran it and from /proc, independently of what the run's
// tasks report.
type Evidence struct {
	// RunCPUSeconds is the user plus system CPU time of `pstrain run` and
	// of every task it started and waited for (the rusage of the run's
	// process when it exits): the whole run, from start to end.
	RunCPUSeconds float64 `json:"run_cpu_seconds"`
	// HostCPUSeconds is the busy CPU time of the whole host (everything but
	// idle and I/O wait in /proc/stat) from the run's start to its end; the
	// part that was not the run's is other load on the machine.
	HostCPUSeconds float64 `json:"host_cpu_seconds"`
	// RunQueueMean and RunQueueMax are the host's runnable tasks
	// (procs_running in /proc/stat, the sampling thread itself left out),
	// sampled every ProcEvery while the run ran; RunQueueSamples counts the
	// samples.
	RunQueueMean    float64 `json:"run_queue_mean"`
	RunQueueMax     float64 `json:"run_queue_max"`
	RunQueueSamples int     `json:"run_queue_samples"`
	// CPUsAllowed is the union of the CPUs the run's processes (the run
	// and its descendants, read from /proc/PID/status) were allowed on, as
	// each process was last seen: "0" for a run pinned to one CPU. (Last
	// seen, because the run's first process is taskset until it has set
	// the affinity and exec'd pstrain.)
	CPUsAllowed string `json:"cpus_allowed"`
	// Processes is the most processes of the run seen at one sample.
	Processes int `json:"processes"`
}

// OtherCPUSeconds is the host's busy CPU time during the run that was not
// the run's (other processes on the machine), never below 0.
func (e Evidence) OtherCPUSeconds() float64 {
	return max(0, e.HostCPUSeconds-e.RunCPUSeconds)
}

// hostStat is one reading of /proc/stat.
type hostStat struct {
	busy    uint64 // CPU ticks of all CPUs not idle or waiting for I/O
	running int    // procs_running: runnable tasks now
}

// parseHostStat reads the aggregate "cpu" line and procs_running of a
// /proc/stat file.
func parseHostStat(b []byte) (hostStat, error) {
	var h hostStat
	var gotCPU, gotRunning bool
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "cpu":
			// user nice system idle iowait irq softirq steal [guest guest_nice]
			if len(f) < 9 {
				return h, fmt.Errorf("/proc/stat: short cpu line %q", line)
			}
			for i, v := range f[1:9] {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return h, fmt.Errorf("/proc/stat: cpu line %q: %w", line, err)
				}
				if i != 3 && i != 4 { // idle, iowait
					h.busy += n
				}
			}
			gotCPU = true
		case "procs_running":
			if len(f) != 2 {
				return h, fmt.Errorf("/proc/stat: bad line %q", line)
			}
			n, err := strconv.Atoi(f[1])
			if err != nil {
				return h, fmt.Errorf("/proc/stat: %q: %w", line, err)
			}
			h.running = n
			gotRunning = true
		}
	}
	if !gotCPU || !gotRunning {
		return h, fmt.Errorf("/proc/stat: no cpu or procs_running line")
	}
	return h, nil
}

// busySeconds is the host's busy CPU time between two readings (0 if the
// counter went back, which the kernel does not do).
func busySeconds(from, to hostStat) float64 {
	if to.busy < from.busy {
		return 0
	}
	return float64(to.busy-from.busy) / userHZ
}

// parentPID reads the parent PID from the contents of /proc/PID/stat. The
// command name (field 2) is in parentheses and may hold spaces and ')', so
// the fields are counted from the last ')'.
func parentPID(stat []byte) (int, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("stat: too few fields")
	}
	return strconv.Atoi(f[1]) // state, then ppid
}

// descendants returns root and every process below it in the parent map
// (pid to parent pid), root first.
func descendants(parents map[int]int, root int) []int {
	children := map[int][]int{}
	for pid, pp := range parents {
		children[pp] = append(children[pp], pid)
	}
	out := []int{root}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// runQueue accumulates run-queue samples.
type runQueue struct {
	n        int
	sum, top float64
}

// add records a procs_running reading; the reading thread is itself
// running, so it counts one less.
func (q *runQueue) add(procsRunning int) {
	v := float64(max(procsRunning-1, 0))
	q.n++
	q.sum += v
	q.top = max(q.top, v)
}

// stats returns the mean and maximum (0 without samples).
func (q runQueue) stats() (mean, top float64) {
	if q.n == 0 {
		return 0, 0
	}
	return q.sum / float64(q.n), q.top
}

// procWatcher samples /proc while one run runs.
type procWatcher struct {
	root  string // the proc file system, normally "/proc"
	every time.Duration
}

func (w procWatcher) hostStat() (hostStat, error) {
	b, err := os.ReadFile(filepath.Join(w.root, "stat"))
	if err != nil {
		return hostStat{}, err
	}
	return parseHostStat(b)
}

// tree lists the run's processes: pid and its descendants.
func (w procWatcher) tree(pid int) []int {
	ents, err := os.ReadDir(w.root)
	if err != nil {
		return []int{pid}
	}
	parents := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(w.root, e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		if pp, err := parentPID(b); err == nil {
			parents[p] = pp
		}
	}
	return descendants(parents, pid)
}

// watch samples until ctx is done: the run queue and the run's processes'
// CPU affinity every w.every. It returns the evidence without
// RunCPUSeconds and HostCPUSeconds (the caller takes them at the ends).
func (w procWatcher) watch(ctx context.Context, pid int) Evidence {
	var q runQueue
	allowed := map[int][]int{} // by pid, as last seen
	procs := 0
	tick := time.NewTicker(w.every)
	defer tick.Stop()
	// A sample slower than a tick leaves both the tick and a cancellation
	// ready: the cancellation wins, so a watch ends with the first sample
	// taken after it is cancelled.
	for done := false; !done; {
		if h, err := w.hostStat(); err == nil {
			q.add(h.running)
		}
		pids := w.tree(pid)
		seen := 0
		for _, p := range pids {
			cs, err := CPUsAllowed(filepath.Join(w.root, strconv.Itoa(p), "status"))
			if err != nil {
				continue
			}
			seen++
			allowed[p] = cs
		}
		procs = max(procs, seen)
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			done = ctx.Err() != nil
		}
	}
	var ev Evidence
	ev.RunQueueMean, ev.RunQueueMax = q.stats()
	ev.RunQueueSamples = q.n
	var cs []int
	for _, l := range allowed {
		cs = append(cs, l...)
	}
	ev.CPUsAllowed = FormatCPUList(cs)
	ev.Processes = procs
	return ev
}
