package launcher

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"github.com/pstrain/pstrain/config"
)

// SlowPrefix starts a slowdown in --fault's list: slow:worker/1@5s:3.
const SlowPrefix = "slow:"

// MaxSlowdown bounds a slowdown's factor: beyond it a worker is as good
// as frozen (kill it with --fault worker/N@T instead).
const MaxSlowdown = 100

// SlowPeriod is the cycle of a slowdown's freezes: in each, the worker
// runs for SlowPeriod/Factor and is stopped for the rest. The shorter
// the period, the less a loaded host slows the worker (likely: the
// scheduler favours a process that was just continued): slowed 3x in a
// sync run on 2 cores at load 25-33, the straggler rule measured it
// 2.1-2.6x slower with a period of 20 ms, 2.3-2.5x with 50 ms and
// 2.9-3.0x with 100 ms (docs/observability.md, "Stragglers").
const SlowPeriod = 100 * time.Millisecond

// Slowdown makes a worker, or a parameter server, Factor times slower
// from At after the cluster started (`--fault slow:worker/1@5s:3`,
// `slow:ps/0@5s:3`), as if it ran on a machine
// Factor times slower: the launcher stops it (SIGSTOP) for (Factor-1)/
// Factor of every SlowPeriod and lets it run (SIGCONT) for the rest,
// like a CPU quota of 1/Factor of a core for a process that always
// wants one. Everything the worker does takes Factor times as long,
// its waits on the network included (a reply that arrives while it is
// stopped is read when it runs again). A restarted worker is slowed too.
type Slowdown struct {
	Task   string
	At     time.Duration
	Factor float64
}

func (s Slowdown) String() string {
	return fmt.Sprintf("%s%s@%s:%g", SlowPrefix, s.Task, s.At, s.Factor)
}

// ParseSlowdowns reads the slow: entries of --fault's comma list
// (ParseFaults reads the others), e.g. "ps/1@8s,slow:worker/1@5s:3":
// each names a worker or a parameter server of the run (of its
// --max-ps slots), a time after the start and a factor above 1 (at most
// MaxSlowdown).
func ParseSlowdowns(s string, r config.Run) ([]Slowdown, error) {
	var out []Slowdown
	for _, part := range strings.Split(s, ",") {
		spec, ok := strings.CutPrefix(strings.TrimSpace(part), SlowPrefix)
		if !ok {
			continue
		}
		sd, err := parseSlowdown(spec, r.Workers, r.PSSlots())
		if err != nil {
			return nil, fmt.Errorf("--fault %q: %w", strings.TrimSpace(part), err)
		}
		out = append(out, sd)
	}
	return out, nil
}

func parseSlowdown(spec string, workers, ps int) (Slowdown, error) {
	task, rest, ok := strings.Cut(spec, "@")
	at, factor, ok2 := strings.Cut(rest, ":")
	role, idx, ok3 := strings.Cut(task, "/")
	n, err := strconv.Atoi(idx)
	count := map[string]int{"worker": workers, "ps": ps}[role]
	if !ok || !ok2 || !ok3 || err != nil || n < 0 || n >= count || strconv.Itoa(n) != idx {
		return Slowdown{}, fmt.Errorf("want slow:worker/N@TIME:FACTOR with N in 0..%d, or slow:ps/N@TIME:FACTOR with N in 0..%d (e.g. slow:worker/1@5s:3, 3 times slower from 5 s)", workers-1, ps-1)
	}
	d, err := time.ParseDuration(at)
	if err != nil || d < 0 {
		return Slowdown{}, fmt.Errorf("%q is not a duration (e.g. 5s)", at)
	}
	f, err := strconv.ParseFloat(factor, 64)
	if err != nil || math.IsNaN(f) || f <= 1 || f > MaxSlowdown {
		return Slowdown{}, fmt.Errorf("factor %q: want a number above 1 and at most %d (3: three times slower)", factor, MaxSlowdown)
	}
	return Slowdown{Task: task, At: d, Factor: f}, nil
}

// dutyCycle is a slowdown's schedule: how long the worker is stopped
// after each time it ran. The stops are owed in proportion to the time
// it actually ran, and a stop that overran is paid back by the next,
// so late wake-ups of the launcher on a loaded host do not change the
// share of the time the worker runs: 1/factor.
type dutyCycle struct {
	factor float64
	owed   time.Duration // stop time owed (negative: overpaid)
}

// run is how long the worker runs in each period.
func (c *dutyCycle) run() time.Duration {
	return time.Duration(float64(SlowPeriod) / c.factor)
}

// ran says the worker ran for d; it returns how long to stop it now
// (0: not at all this period), at most maxStop (the rest stays owed:
// a process is never stopped long enough to miss its heartbeats).
func (c *dutyCycle) ran(d time.Duration) time.Duration {
	c.owed += time.Duration(float64(d) * (c.factor - 1))
	return min(max(c.owed, 0), maxStop)
}

// maxStop bounds one stop of a slowed process, far below any heartbeat
// timeout.
const maxStop = 200 * time.Millisecond

// stopped says the worker was stopped for d.
func (c *dutyCycle) stopped(d time.Duration) { c.owed -= d }

// OnCPU says the slowdown's stops are owed for the CPU time the process
// used rather than the time it ran: a parameter server's. A PS waits for
// requests most of the time; stopped for (F-1)/F of every period whether
// it works or not, it would answer late however little it had to do, and
// no move of rows could help it. Owed for its CPU, it is a CPU quota of
// 1/F of a core (as a container's CPU limit is): each request waits for
// the CPU it needs, and the more work it is given the slower it answers
// (docs/elastic.md, "Rebalancing"). A worker always wants the CPU, so
// the two are alike for it; it keeps the time it ran.
func (s Slowdown) OnCPU() bool { return strings.HasPrefix(s.Task, "ps/") }

// cpuMeter reads how much CPU a slowed process used since it last read
// it (a new process starts it afresh).
type cpuMeter struct {
	pid  int
	last time.Duration
}

// since is the CPU p's process used since the last call (0 at the first
// call for a process, or when it cannot be read).
func (m *cpuMeter) since(p *proc) time.Duration {
	cpu, err := processCPU(p.cmd.Process.Pid)
	if err != nil {
		return 0
	}
	d := cpu - m.last
	if p.cmd.Process.Pid != m.pid {
		d = 0
	}
	m.pid, m.last = p.cmd.Process.Pid, cpu
	return max(d, 0)
}

// processCPU is the user and system CPU time process pid used, all its
// threads (counted in clock ticks, 10 ms on Linux).
func processCPU(pid int) (time.Duration, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), nil
}

// slow carries out sd: from sd.At after the start it stops and
// continues the task's current process on sd's duty cycle until the
// run finishes or ctx ends, and leaves it running.
func (s *supervisor) slow(ctx context.Context, sd Slowdown) {
	select {
	case <-time.After(time.Until(s.t0.Add(sd.At))):
	case <-ctx.Done():
		return
	}
	c := &dutyCycle{factor: sd.Factor}
	var cpu cpuMeter
	s.c.Log.Warn("fault: slowing task down (stopped with SIGSTOP for part of every period)", "task", sd.Task, "factor", sd.Factor,
		"runs", c.run(), "of", SlowPeriod, "for_cpu_used", sd.OnCPU(), "at", s.since(time.Now()))
	for {
		start := time.Now()
		if !sleepCtx(ctx, c.run()) {
			return
		}
		p := s.slowable(sd.Task)
		ran := time.Since(start)
		if sd.OnCPU() && p != nil {
			ran = cpu.since(p)
		}
		stop := c.ran(ran)
		if stop <= 0 {
			continue
		}
		if p == nil {
			if s.stopping() || s.isFinished() {
				return
			}
			c.owed = 0 // (restarting: the next process is slowed, from now)
			continue
		}
		start = time.Now()
		if p.cmd.Process.Signal(syscall.SIGSTOP) != nil {
			continue
		}
		ok := sleepCtx(ctx, stop)
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		c.stopped(time.Since(start))
		if !ok {
			return
		}
	}
}

// slowable is task's process while the run goes on (nil: none, it has
// exited, or the run is ending: a worker must see the end of training
// at full speed).
func (s *supervisor) slowable(task string) *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[task]
	if p == nil || s.finished || s.interrupted || hasExited(p) {
		return nil
	}
	return p
}

// sleepCtx sleeps for d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
