// Package launcher runs a whole cluster on this machine as separate
// processes (`pstrain run`): it picks ports, writes the cluster file and
// the Prometheus file_sd targets, starts the chief, the PS shards (and,
// with --ps-replicas 1, a hot standby for each: standby/N) and the
// workers, relays the chief's progress, watches every process, and
// assembles the report with each process's peak RSS and CPU time.
//
// Run works in two parts. The plan (plan.go) is what the run launches,
// a plain function of the configuration and the reserved ports: the
// cluster file's addresses, each task's metrics and data-plane address
// and command line, and which tasks start at once. The supervisor
// executes it: it starts the tasks, restarts those that fail, injects
// the faults, watches where the time goes and winds the run down.
//
// Watching a task: a task that dies, exits with status 0 while the run
// goes on, or answers nothing on /healthz for TaskTimeout (liveness.go)
// is restarted, up to MaxRestarts times. Tasks are forked from one
// thread that lives as long as the run (forker.go), so that they die
// with the launcher; pid files in <Dir>/pids (stale.go) let the next
// run on the directory find any process that did not. The report's
// restarts, with their causes, are on the run's clock (restarts.go).
package launcher

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/bottleneck"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/observe/webconfig"
	"github.com/pstrain/pstrain/transport/auth"
)

// Config describes the local run.
type Config struct {
	Run config.Run
	Exe string // the pstrain binary
	Dir string // run directory: cluster.json, logs/, chief-report.json
	// SDDir receives the Prometheus file_sd target file.
	SDDir string
	// MetricsPortBase: chief on base, ps/i on base+1+i, worker/i on
	// base+1+P+i, standby/i (--ps-replicas 1) on base+1+P+W+i, P being
	// the PS slots (Run.PSSlots) and W the worker slots
	// (Run.WorkerSlots). 0 picks free ports.
	MetricsPortBase int
	// ChildArgs renders the run configuration as flags.
	ChildArgs func(config.Run) []string
	// ExtraArgs are passed to every child (e.g. --connect-timeout).
	ExtraArgs []string
	// AuthTokenFile is the run's secret, passed to every child; "" makes
	// a fresh one, Dir/auth-token, once the run directory is claimed (so
	// a launch refused beside a live run leaves that run's token alone,
	// and tasks of an earlier launch cannot talk to this one's).
	AuthTokenFile string
	// WebConfigFile is the exporter web config file (TLS, basic auth)
	// for the tasks' metrics endpoints ("" = plain HTTP). The tasks get
	// a copy in Dir that also lets the launcher's own probes and scrapes
	// in (observe/webconfig.ForLauncher).
	WebConfigFile string
	Progress      io.Writer // where the chief's progress goes
	Log           *slog.Logger
	// Faults are SIGKILLs to inject (--fault).
	Faults []Fault
	// Slowdowns are workers to slow down (--fault slow:...; slow.go).
	Slowdowns []Slowdown
	// MaxRestarts bounds the restarts of each task (`pstrain run`'s
	// default is 5; 0 means none); past it the run fails.
	MaxRestarts int
	// RestartBackoff is the first restart delay (default 250ms), doubled
	// for each further restart of the task up to 5s.
	RestartBackoff time.Duration
	// BottleneckEvery is how often the progress shows where the time
	// goes (0 = never; the report always has the whole run's).
	BottleneckEvery time.Duration
	// Abort, when closed, kills every task at once (a deliberate second
	// Ctrl-C; pstrain run closes it on a SIGINT more than a second after
	// the first signal: internal/interrupt).
	// Ending Run's context instead stops the run cleanly: the chief is
	// sent SIGTERM and winds the run down (final checkpoint, report).
	Abort <-chan struct{}
	// TaskTimeout: a task whose /healthz has answered nothing for this
	// long (after answering once) is killed with SIGKILL and restarted
	// like any task that died; and a task that exits with status 0 while
	// the run is not ending within this long is restarted too. 0
	// disables the probes (the exit-0 wait is then 10 s).
	TaskTimeout time.Duration
	// KillStale: processes of an earlier run on Dir that are still alive
	// are killed (SIGKILL) instead of failing the run with a StaleError.
	KillStale bool
	// TimerSlack is the timer slack every task runs with (Linux; 0 keeps
	// the launcher's own, the kernel's default of 50 µs). `pstrain run`
	// uses TaskTimerSlack.
	TimerSlack time.Duration
}

// TaskTimerSlack is `pstrain run`'s --timer-slack: how late the kernel
// may wake a task's sleeping thread to batch wake-ups.
//
// Why: a Go process with GOMAXPROCS=1 (the launcher's default for a
// task on 2 cores, taskEnv) whose one P is in a cgo call (a worker's
// matrix product, ~1-3 ms) has no idle P, so the runtime's monitor
// thread (sysmon) takes the P back after a 20 µs sleep and, having done
// so, keeps sleeping 20 µs. With the kernel's 50 µs slack a worker's
// monitor woke every ~90 µs while it computed: ~3,000 times a second in
// the default cluster, ~11,000 with 1 PS and 1 worker (perf sched), each
// wake a context switch on the cores the workers compute on. With 1 ms
// of slack it wakes ~1,000 times a second; CPU per sample fell 6-8% in
// alternated runs. The cost: a timer in a task may fire up to 1 ms
// late. A task's latency-sensitive waits are on sockets and channels,
// which wake at once; its timers (retry back-offs, heartbeats,
// deadlines) are 20 ms and longer (docs/scaling.md, "The levers in the code").
const TaskTimerSlack = time.Millisecond

type proc struct {
	task    cluster.Task
	cmd     *exec.Cmd
	log     string
	done    chan struct{}
	err     error
	metrics string
	// cause is set (under supervisor.mu) when the launcher kills the
	// process itself: CauseFault or CauseUnresponsive.
	cause string
	// killedAt is when a fault killed the process (under supervisor.mu;
	// zero otherwise): its death, which the launcher sees only once the
	// kernel has torn the process down and Wait returned, tens of
	// milliseconds later on a loaded machine, after its peers (a standby
	// taking over) already saw it.
	killedAt time.Time
}

// Fault kills a task with SIGKILL at a time after the cluster started
// (`--fault ps/1@8s`), or once the run reaches a point of its progress
// (`ps/1@step:40`, `ps/1@checkpoint:1`), optionally a delay after it
// (`ps/1@checkpoint:1+300ms`; progressfault.go).
type Fault struct {
	Task string
	// At is the time after the cluster started when When is zero, else
	// the delay after When is reached.
	At time.Duration
	// When is the progress the fault waits for (zero: none, At is on
	// the clock).
	When Mark
}

// ParseFaults reads "ps/1@8s,worker/0@12s,chief@20s,standby/0@3s,
// ps/0@step:40,ps/1@checkpoint:1+300ms" and checks each task against
// the run's shape. Entries starting with SlowPrefix are ParseSlowdowns'
// and left out.
func ParseFaults(s string, r config.Run) ([]Fault, error) {
	var out []Fault
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	valid := map[string]bool{}
	for _, t := range (cluster.Spec{Chief: []string{""}, PS: make([]string, r.PS), Worker: make([]string, r.Workers), Standby: make([]string, r.Standbys())}).Tasks() {
		valid[t.String()] = true
	}
	standbys := ""
	if r.Standbys() > 0 {
		standbys = fmt.Sprintf(", standby/0..standby/%d", r.Standbys()-1)
	}
	for _, part := range strings.Split(s, ",") {
		if strings.HasPrefix(strings.TrimSpace(part), SlowPrefix) {
			continue
		}
		task, at, ok := strings.Cut(strings.TrimSpace(part), "@")
		if task == "chief/0" {
			task = "chief"
		}
		if !ok || !valid[task] {
			return nil, fmt.Errorf("--fault %q: want TASK@TIME with TASK one of chief, ps/0..ps/%d%s, worker/0..worker/%d (e.g. ps/1@8s, ps/1@step:40)", part, r.PS-1, standbys, r.Workers-1)
		}
		when, d, err := parseFaultTime(at)
		if err != nil {
			return nil, fmt.Errorf("--fault %q: %w", part, err)
		}
		out = append(out, Fault{Task: task, At: d, When: when})
	}
	return out, nil
}

// supervisor runs the processes of one local cluster.
type supervisor struct {
	c    Config
	plan plan
	// t0 is the run's start: every time the launcher logs or reports is
	// seconds since t0 (see since).
	t0      time.Time
	forker  *forker
	targets *targets
	pidDir  string // <Dir>/pids: a pid file per live process (stale.go)
	proc    procFS
	scaler  *scaler   // elastic workers (scale.go)
	psScale *psScaler // parameter servers added and removed (psscale.go)
	// env is every task's environment (taskEnv).
	env []string
	// web reaches the tasks' metrics endpoints (nil: plain HTTP).
	web *webconfig.Client

	mu       sync.Mutex
	procs    map[string]*proc
	usage    map[string]report.Task // summed over a task's processes
	restarts []restart
	// ended are the processes that ended during the run and were not
	// restarted, by design: quarantined, or removed by a scale request.
	ended    []restart
	finished bool // the chief is done: exits are no longer restarted
	// interrupted: the run is being stopped on a signal; no task is
	// restarted or faulted any more.
	interrupted bool
	// stragglers follows the workers slower than the others (stragglers.go).
	stragglers *bottleneck.StragglerLog
	// mon scrapes every initial task (nil until it started): a rebalance
	// measures with it (rebalance.go).
	mon *bottleneck.Monitor
}

func (s *supervisor) stopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.interrupted
}

func (s *supervisor) isFinished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finished
}

// since is t on the run's clock, as the launcher logs it: "4.02s".
func (s *supervisor) since(t time.Time) string {
	return fmt.Sprintf("%.2fs", t.Sub(s.t0).Seconds())
}

// stopWhenUp sends p SIGTERM once its metrics endpoint answers: by then
// the process handles the signal (a stop in order) rather than dying of
// it.
func (s *supervisor) stopWhenUp(ctx context.Context, p *proc) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	url := s.web.URL(p.metrics, metrics.HealthPath)
	client := s.web.HTTP(time.Second)
	defer client.CloseIdleConnections()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.done:
			return
		case <-t.C:
		}
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			p.cmd.Process.Signal(syscall.SIGTERM)
			return
		}
	}
}

// stoppedBySignal says the process exited as a task does after stopping
// cleanly on SIGINT or SIGTERM (status 130 or 143).
func stoppedBySignal(p *proc) bool {
	c := p.cmd.ProcessState.ExitCode()
	return c == 130 || c == 143
}

// ExitFinalCheckpointFailed is the exit status of a chief that finished
// its run and wrote the report, but whose final checkpoint failed: the
// trained model is not saved. The launcher does not restart such a
// chief; `pstrain run` exits with the same status.
const ExitFinalCheckpointFailed = 3

// ExitChiefGaveUp is the exit status of a chief that ended the run on
// purpose with an error (its tasks never registered, the model kept
// diverging): the launcher does not restart it, and the run fails with
// an error wrapping ErrChiefGaveUp (`pstrain run` exits 4 too).
const ExitChiefGaveUp = 4

// ErrChiefGaveUp is wrapped by Run's error when the chief gave up on the
// run (ExitChiefGaveUp without a ruined report).
var ErrChiefGaveUp = errors.New("the chief gave up on the run")

// Run starts the cluster and waits for it to finish.
func Run(ctx context.Context, c Config) (*report.Report, error) {
	t0 := time.Now()
	if err := c.Run.Validate(); err != nil {
		return nil, err
	}
	// The chief's progress (copied from its stdout) and the bottleneck
	// lines share the writer.
	if c.Progress != nil {
		c.Progress = &lockedWriter{w: c.Progress}
	}
	if c.RestartBackoff <= 0 {
		c.RestartBackoff = 250 * time.Millisecond
	}
	if err := os.MkdirAll(filepath.Join(c.Dir, "logs"), 0o700); err != nil {
		return nil, err
	}
	pidDir := filepath.Join(c.Dir, "pids")
	if err := claimRunDir(ctx, c, pidDir, procFS("/proc")); err != nil {
		return nil, err
	}
	defer os.Remove(pidFileName(pidDir, "launcher"))
	web, err := secureTasks(&c)
	if err != nil {
		return nil, err
	}
	// The cluster has a worker slot for every worker the run may scale to
	// (--max-workers), and every task is told the slots the cluster file
	// lists; the first --workers start.
	c.Run.MaxWorkers = c.Run.WorkerSlots()
	c.Run.MaxPS = c.Run.PSSlots() // likewise PS slots (--max-ps)
	// Every port a task binds is reserved here: gRPC, metrics, and each
	// PS's (and standby's) data plane.
	ports, err := freePorts(portCount(c))
	if err != nil {
		return nil, err
	}
	p, err := planRun(c, fmt.Sprintf("run-%d", t0.UnixNano()), ports)
	if err != nil {
		return nil, err
	}
	r := c.Run
	s := &supervisor{c: c, plan: p, t0: t0, procs: map[string]*proc{}, usage: map[string]report.Task{}, stragglers: bottleneck.NewStragglerLog(),
		pidDir: pidDir, proc: procFS("/proc"), web: web,
		env: taskEnv(os.Environ(), runtime.NumCPU(), 1+r.PS+r.Workers+r.Standbys())}
	return s.run(ctx)
}

// secureTasks adds the run's token file (made here when c names none)
// and, with a web config, the tasks' copy of it to c.ExtraArgs; it
// returns the client that reaches the tasks' metrics endpoints.
func secureTasks(c *Config) (*webconfig.Client, error) {
	tokenPath, err := runToken(c.AuthTokenFile, c.Dir)
	if err != nil {
		return nil, err
	}
	c.ExtraArgs = append(append([]string(nil), c.ExtraArgs...), "--auth-token-file="+tokenPath)
	if c.WebConfigFile == "" {
		return nil, nil
	}
	taskFile, web, err := webconfig.ForLauncher(c.WebConfigFile, c.Dir, rand.Reader)
	if err != nil {
		return nil, err
	}
	c.ExtraArgs = append(c.ExtraArgs, "--web.config.file="+taskFile)
	return web, nil
}

// prepareDir writes the cluster file and an empty targets file, and
// removes what an earlier run on the directory left for the chief.
func (s *supervisor) prepareDir() error {
	if err := os.WriteFile(s.plan.clusterFile, s.plan.spec.JSON(), 0o644); err != nil {
		return err
	}
	s.targets = newTargets(s.c.SDDir, s.plan.tasks, s.plan.metricsAddr)
	// (Each task is listed once started: the worker slots of an elastic
	// run are not, until a scale request starts them.)
	if err := s.targets.setAll(false); err != nil {
		return err
	}
	os.Remove(s.plan.chiefReport)
	os.Remove(s.plan.statePath)
	os.Remove(s.plan.scaleFile) // an earlier run's
	return nil
}

// group is what the goroutines of a run share: the context that ends
// them, the group that waits for them, and where a task's supervision
// reports its end.
type group struct {
	ctx       context.Context
	wg        *sync.WaitGroup
	chiefDone chan error
	failed    chan error
}

// goDo runs f on a goroutine of the group.
func (g group) goDo(f func()) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
}

// run executes the plan: it starts the tasks, supervises them until the
// chief ends the run, winds the run down and returns its report.
func (s *supervisor) run(ctx context.Context) (*report.Report, error) {
	if err := s.prepareDir(); err != nil {
		return nil, err
	}
	// Whatever the outcome, no target of this run outlives it.
	defer func() {
		if err := s.targets.setAll(false); err != nil {
			s.c.Log.Warn("could not empty the Prometheus targets file", "dir", s.c.SDDir, "err", err)
		}
	}()
	// Every task is started from one thread that lives as long as the
	// run (see forker); it ends after every task has exited.
	s.forker = newForker(s.c.TimerSlack)
	defer s.forker.close()
	if err := <-s.forker.slack; err != nil && !errors.Is(err, errNoSlack) {
		s.c.Log.Warn("could not set the tasks' timer slack; they run with the kernel's default", "slack", s.c.TimerSlack, "err", err)
	}
	// The tasks live until the run ends or is aborted, not until ctx
	// ends: an interrupt only asks the chief to stop the run.
	interrupt := ctx.Done()
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	g := group{ctx: ctx, wg: &wg, chiefDone: make(chan error, 1), failed: make(chan error, len(s.plan.tasks))}
	if err := s.startAll(g); err != nil {
		return nil, err
	}
	mon, stopMon, err := s.startMonitor(g)
	if err != nil {
		return nil, err
	}
	defer stopMon()
	s.mu.Lock()
	s.mon = mon
	s.mu.Unlock()
	if err := s.wait(interrupt, g.chiefDone, g.failed); err != nil {
		return nil, err
	}
	stopMon()
	s.windDown()
	cancel()
	wg.Wait()
	return s.finalReport(mon)
}

// startAll starts the plan's initial tasks, the scaler and the faults.
func (s *supervisor) startAll(g group) error {
	r := s.c.Run
	s.scaler = &scaler{s: s, slotSet: slotSet{role: cluster.Worker, slots: s.plan.slots, target: r.Workers, running: map[int]bool{},
		start: func(t cluster.Task) error { return s.launch(g, s.plan.workerIndex(t.Index), t) }}}
	s.psScale = &psScaler{s: s, slotSet: slotSet{role: cluster.PS, slots: s.plan.psSlots, target: r.PS, running: map[int]bool{}},
		standbys: map[int]bool{}}
	s.psScale.start = func(t cluster.Task) error { return s.psScale.startSlot(g, t.Index) }
	s.psScale.startStandby = func(k int) error {
		return s.launch(g, s.plan.standbyIndex(k), cluster.Task{Type: cluster.Standby, Index: k})
	}
	for _, i := range s.plan.initial {
		t := s.plan.tasks[i]
		switch t.Type {
		case cluster.Worker:
			s.scaler.running[t.Index] = true
		case cluster.PS:
			s.psScale.running[t.Index] = true
		case cluster.Standby:
			s.psScale.standbys[t.Index] = true
		}
		if err := s.launch(g, i, t); err != nil {
			return err
		}
	}
	s.scaler.writeStatus()
	g.goDo(func() { s.scaler.watch(g.ctx, s.c.Dir, 200*time.Millisecond) })
	reached := s.startMarkWatch(g)
	for i, f := range s.c.Faults {
		g.goDo(func() { s.inject(g.ctx, f, reached[i]) })
	}
	for _, sd := range s.c.Slowdowns {
		g.goDo(func() { s.slow(g.ctx, sd) })
	}
	s.c.Log.Info("cluster started", "chief", s.plan.spec.Chief[0], "ps", len(s.plan.spec.PS), "standbys", len(s.plan.spec.Standby),
		"workers", r.Workers, "max_workers", s.plan.slots, "logs", s.plan.logDir, "run", s.plan.runID)
	return nil
}

// launch starts task t (index i in the plan) and supervises it on a
// goroutine of g, which reports the task's end on g's channels.
func (s *supervisor) launch(g group, i int, t cluster.Task) error {
	p, err := s.start(g.ctx, g.wg, i, t)
	if err != nil {
		return err
	}
	s.setTarget(i, true)
	g.goDo(func() {
		err := s.supervise(g.ctx, g.wg, i, p)
		s.setTarget(i, false)
		switch t.Type {
		case cluster.Worker:
			s.scaler.exited(t.Index)
		case cluster.PS:
			s.psScale.exited(t.Index)
		case cluster.Standby:
			s.psScale.standbyExited(t.Index)
		}
		switch {
		case t.Type == cluster.Chief:
			g.chiefDone <- err
		case err != nil:
			g.failed <- err
		}
	})
	return nil
}

// setTarget lists task i in the Prometheus targets file, or drops it.
func (s *supervisor) setTarget(i int, live bool) {
	if err := s.targets.set(i, live); err != nil {
		s.c.Log.Warn("could not update the Prometheus targets file", "dir", s.c.SDDir, "err", err)
	}
}

// startMonitor watches where the time goes: it scrapes every initial
// task each second, says it every BottleneckEvery, and has the whole
// run's at the end. The monitor runs until stop is called or g ends.
func (s *supervisor) startMonitor(g group) (mon *bottleneck.Monitor, stop func(), err error) {
	var targets []bottleneck.Target
	for _, i := range s.plan.initial {
		t := s.plan.tasks[i]
		role := t.Type
		if role == cluster.Standby {
			role = bottleneck.RolePS // a shard's second process: a PS either way
		}
		targets = append(targets, bottleneck.Target{Task: t.String(), Role: role, URL: s.web.URL(s.plan.metricsAddr(i), metrics.MetricsPath)})
	}
	scrapeClient := s.web.HTTP(0) // each scrape is bounded by the monitor's context
	scrape := func(ctx context.Context, url string) (metrics.Families, error) {
		return metrics.ScrapeWith(ctx, scrapeClient, url)
	}
	mon, err = bottleneck.NewMonitor(bottleneck.MonitorConfig{Targets: targets, Cores: runtime.NumCPU(), Scrape: scrape})
	if err != nil {
		return nil, nil, err
	}
	ctx, stop := context.WithCancel(g.ctx)
	g.goDo(func() {
		defer scrapeClient.CloseIdleConnections()
		s.monitor(ctx, mon)
	})
	return mon, stop, nil
}

// monitor runs mon until ctx ends, printing a
// bottleneck line to the progress every BottleneckEvery.
func (s *supervisor) monitor(ctx context.Context, mon *bottleneck.Monitor) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	every, progress := s.c.BottleneckEvery, s.c.Progress
	last := time.Now() // the first line covers a whole interval, not start-up
	_ = mon.Run(ctx, tick.C, func(snap bottleneck.Snapshot) {
		s.watchStragglers(mon, snap.Time)
		if progress == nil || every <= 0 || time.Since(last) < every {
			return
		}
		if b, err := mon.Window(every); err == nil && b.Phases != nil {
			last = time.Now()
			fmt.Fprintln(progress, "bottleneck:", b.String())
		}
	})
}

// windDown waits for every task to exit once the
// chief is done (it shut the PS down; workers exit when they see
// training done), killing what has not after a grace period.
func (s *supervisor) windDown() {
	s.mu.Lock()
	s.finished = true
	procs := maps.Clone(s.procs)
	interrupted := s.interrupted
	s.mu.Unlock()
	if interrupted {
		// The final checkpoint is written: nothing is left to lose.
		for _, p := range procs {
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	reap(slices.Collect(maps.Values(procs)), windDownGrace, func(p *proc) {
		s.c.Log.Warn("task did not exit after training; killing it", "task", p.task)
		p.cmd.Process.Kill()
		<-p.done
		s.noteEnded(p, CauseKilledAtEnd)
	})
}

// windDownGrace is how long tasks have to exit once the chief is done.
const windDownGrace = 15 * time.Second

// reap waits for every proc to exit, and hands to kill (which returns once
// the proc has exited) each one still running after grace: all of them,
// however many, since the deadline stays passed once it has.
func reap(procs []*proc, grace time.Duration, kill func(*proc)) {
	deadline := make(chan struct{})
	t := time.AfterFunc(grace, func() { close(deadline) })
	defer t.Stop()
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			if !hasExited(p) { // both may be ready: an exit is not a kill
				kill(p)
			}
		}
	}
}

// finalReport is the chief's report with what the launcher saw: each
// task's resource use, the bottleneck, the restarts and the processes
// that ended for good.
func (s *supervisor) finalReport(mon *bottleneck.Monitor) (*report.Report, error) {
	rep, err := report.Read(s.plan.chiefReport)
	if err != nil {
		return nil, fmt.Errorf("launcher: the chief finished without a report: %w", err)
	}
	if rep.TrainStartedUnix > 0 {
		rep.StartupSeconds = rep.TrainStartedUnix - float64(s.t0.UnixNano())/1e9
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rep.Tasks = s.usage
	if b, err := mon.Whole(); err == nil {
		rep.Bottleneck = &b
	}
	rep.Stragglers = s.stragglers.Stragglers()
	rep.Restarts = mergeRestarts(rep.Restarts, s.restarts, s.t0, rep.TrainStartedUnix, rep.Mode == string(config.Sync))
	rep.Restarts = append(rep.Restarts, endedRecords(s.ended, s.t0)...)
	for _, e := range s.ended {
		if u, ok := rep.Tasks[e.task]; ok {
			u.Ended = e.cause
			rep.Tasks[e.task] = u
		}
	}
	return rep, nil
}

// launchOrder is the cluster's tasks in the order the launcher numbers
// them (ports, metrics ports, targets): the chief, ps/0.., the worker
// slots, then standby/0.. (--ps-replicas 1). The standbys come last so
// that every other task's number, hence its ports, is the same with or
// without them.
func launchOrder(spec cluster.Spec) []cluster.Task {
	var out, standbys []cluster.Task
	for _, t := range spec.Tasks() {
		if t.Type == cluster.Standby {
			standbys = append(standbys, t)
			continue
		}
		out = append(out, t)
	}
	return append(out, standbys...)
}

// wait waits for the chief to finish the run. On interrupt it asks the
// chief to stop the run cleanly (SIGTERM: it stops the shards, scores and
// checkpoints the model and writes the report) and no task is restarted
// any more; on Abort it kills every task at once.
func (s *supervisor) wait(interrupt <-chan struct{}, chiefDone, failed <-chan error) error {
	for {
		select {
		case err := <-chiefDone:
			return err
		case err := <-failed:
			return err
		case <-interrupt:
			interrupt = nil
			s.mu.Lock()
			s.interrupted = true
			chief := s.procs[cluster.Chief]
			s.mu.Unlock()
			s.c.Log.Warn("interrupted: the chief is stopping the run cleanly (Ctrl-C again, a second or more later, to stop at once)")
			if chief != nil {
				chief.cmd.Process.Signal(syscall.SIGTERM)
			}
		case <-s.c.Abort:
			s.mu.Lock()
			s.finished = true
			for _, p := range s.procs {
				p.cmd.Process.Kill()
			}
			s.mu.Unlock()
			return errors.New("launcher: interrupted again: every task killed (the run has no final checkpoint)")
		}
	}
}

// start starts task t's process (index i in the cluster's task list)
// and the goroutine (in wg) that kills it if it stops answering.
func (s *supervisor) start(ctx context.Context, wg *sync.WaitGroup, i int, t cluster.Task) (*proc, error) {
	c := s.c
	args := s.plan.args[i]
	cmd := exec.Command(c.Exe, args...)
	cmd.Env = s.env
	// Each task in its own process group, so a Ctrl-C at the terminal
	// reaches only this launcher, which stops the run in order (see
	// wait); and killed with the launcher, so no task outlives it
	// (Pdeathsig, from the forker's thread: see forker).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logPath := s.plan.logPath(t)
	// A restarted task appends to its predecessor's log; a new run starts
	// the log afresh.
	flags := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	s.mu.Lock()
	if _, restarted := s.usage[t.String()]; !restarted {
		flags |= os.O_TRUNC
	}
	s.mu.Unlock()
	lf, err := os.OpenFile(logPath, flags, 0o600)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = lf
	cmd.Stdout = lf
	if t.Type == cluster.Chief && c.Progress != nil {
		cmd.Stdout = c.Progress
	}
	if err := s.forker.start(cmd); err != nil {
		lf.Close()
		return nil, fmt.Errorf("launcher: starting %s: %w", t, err)
	}
	pidFile := pidFileName(s.pidDir, t.String())
	if err := writePidFile(s.pidDir, s.proc.record(t.String(), cmd.Process.Pid, cmd.Args)); err != nil {
		c.Log.Warn("could not write the task's pid file", "task", t, "err", err)
	}
	p := &proc{task: t, cmd: cmd, log: logPath, done: make(chan struct{}), metrics: s.plan.metricsAddr(i)}
	go func() {
		p.err = cmd.Wait()
		os.Remove(pidFile)
		lf.Close()
		close(p.done)
	}()
	s.mu.Lock()
	s.procs[t.String()] = p
	s.mu.Unlock()
	if c.TaskTimeout > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.watch(ctx, p)
		}()
	}
	return p, nil
}

// watch kills p with SIGKILL once it has answered nothing on /healthz
// for TaskTimeout (a frozen process: SIGSTOP, a hung host, a deadlock
// that holds the whole runtime); supervise then restarts it like any
// task that died, with cause unresponsive.
func (s *supervisor) watch(ctx context.Context, p *proc) {
	if !watchLiveness(ctx, s.web, s.web.URL(p.metrics, metrics.HealthPath), s.c.TaskTimeout, p.done) {
		return
	}
	s.mu.Lock()
	if s.finished || hasExited(p) {
		// The run is over (Run's own grace kills what does not exit), or
		// the process ended by itself meanwhile.
		s.mu.Unlock()
		return
	}
	p.cause = CauseUnresponsive
	s.mu.Unlock()
	s.c.Log.Warn("task unresponsive: killing it with SIGKILL", "task", p.task, "pid", p.cmd.Process.Pid,
		"silent_for", s.c.TaskTimeout, "at", s.since(time.Now()))
	p.cmd.Process.Kill()
}

// exitVerdict is what an exited task means for the run.
type exitVerdict int

const (
	taskDone   exitVerdict = iota // ended as it should: not restarted
	taskFailed                    // the chief failed: the run fails
	taskCrash                     // restart it
)

// judge says what p's exit means. A task other than the chief that
// exits with status 0 is done only if the run is ending (judged within
// a grace period, see runEnding); otherwise it failed like any other,
// and is restarted.
func (s *supervisor) judge(ctx context.Context, p *proc) exitVerdict {
	s.mu.Lock()
	ending := s.finished || ctx.Err() != nil
	s.mu.Unlock()
	if p.task.Type == cluster.Chief {
		return s.judgeChief(p, ending)
	}
	switch {
	case ending || s.stopping():
		return taskDone
	case s.removed(p):
		return taskDone
	case p.err == nil && s.runEnding(ctx):
		return taskDone
	}
	return taskCrash
}

// removed says p's task left the run on purpose (a scale request or the
// chief's quarantine), noting its end: it is not restarted.
func (s *supervisor) removed(p *proc) bool {
	if s.scaler != nil && p.task.Type != cluster.Chief {
		s.scaler.poll() // (the chief may have acted on a request first)
	}
	switch {
	case p.task.Type == cluster.Worker && s.scaler != nil && s.scaler.retiring(p.task.Index):
		// Removed by a scale request (docs/elastic.md): it exits 0 when
		// its shards say done; any other end is logged, not restarted.
		if p.err != nil {
			s.c.Log.Warn("a removed worker did not exit cleanly", "task", p.task, "err", exitText(p))
		} else {
			s.c.Log.Info("removed worker exited", "task", p.task)
		}
		s.noteEnded(p, CauseRemoved)
		return true
	case (p.task.Type == cluster.PS || p.task.Type == cluster.Standby) && s.psScale != nil && s.psScale.retiring(p.task.Index):
		s.noteRemovedPS(p) // removed by a scale request (psscale.go), with its standby
		return true
	case p.task.Type == cluster.Worker && quarantinedIn(s.plan.statePath, s.plan.runID, p.task.Index):
		// Quarantined by the chief (docs/security.md): its pulls answer
		// done and a new process of it would be refused.
		s.c.Log.Warn("quarantined worker exited; not restarted", "task", p.task, "err", exitText(p))
		s.noteEnded(p, CauseQuarantined)
		return true
	}
	return false
}

// judgeChief says what the chief's exit means; ending says the run was
// already over (finished, or the launcher's context ended).
func (s *supervisor) judgeChief(p *proc, ending bool) exitVerdict {
	code := p.cmd.ProcessState.ExitCode()
	switch {
	case code == ExitChiefGaveUp && !ruinedReport(s.plan.chiefReport):
		return taskFailed
	case code == ExitChiefGaveUp:
		// The chief finished the run with its report, but the model is
		// ruined: the run's end, which `pstrain run` reports with the
		// same status.
		return taskDone
	case stoppedBySignal(p) || code == ExitFinalCheckpointFailed:
		// The chief stopped the run cleanly on a signal (ours, or one
		// sent to it directly), or finished it without its final
		// checkpoint: its report is written.
		return taskDone
	case ending && p.err != nil:
		return taskFailed
	case ending || p.err == nil:
		return taskDone // the chief ends the run
	}
	return taskCrash
}

// runEnding waits (up to TaskTimeout, or 10 s without one) for a sign
// that the run is ending: the chief began to stop it (its state file
// says why) or finished it, or the launcher is stopping it. At the end
// of a run the PS exit after the chief began the stop, and a worker may
// exit just before it (the shards said "done" a poll before the chief
// saw it), hence the wait. (A chief that merely died is no sign: it is
// being restarted.)
func (s *supervisor) runEnding(ctx context.Context) bool {
	grace := s.c.TaskTimeout
	if grace <= 0 {
		grace = 10 * time.Second
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		ending := s.finished || s.interrupted
		s.mu.Unlock()
		if ending || stopBegun(s.plan.statePath, s.plan.runID) {
			return true
		}
		select {
		case <-ctx.Done():
			return true
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
}

// ruinedReport says the chief's report at path exists and says the
// model is ruined (the chief exits 4 after writing it).
func ruinedReport(path string) bool {
	rep, err := report.Read(path)
	return err == nil && rep.Ruined != ""
}

// quarantinedIn says the chief's state file (of run runID) lists worker
// index as quarantined.
func quarantinedIn(statePath, runID string, index int) bool {
	b, err := os.ReadFile(statePath)
	if err != nil {
		return false
	}
	var st struct {
		RunID       string `json:"run_id"`
		Quarantined []int  `json:"quarantined"`
	}
	return json.Unmarshal(b, &st) == nil && st.RunID == runID && slices.Contains(st.Quarantined, index)
}

// noteEnded records that p's process ended, for cause, and was not
// restarted.
func (s *supervisor) noteEnded(p *proc, cause string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = append(s.ended, restart{task: p.task.String(), cause: cause, exitedAt: time.Now()})
}

func hasExited(p *proc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stopBegun reports whether the chief's state file (run runID) says the
// chief began to stop the run.
func stopBegun(statePath, runID string) bool {
	b, err := os.ReadFile(statePath)
	if err != nil {
		return false
	}
	var st struct {
		RunID     string `json:"run_id"`
		StoppedBy string `json:"stopped_by"`
	}
	return json.Unmarshal(b, &st) == nil && st.RunID == runID && st.StoppedBy != ""
}

// supervise waits for task p's process and restarts it while it exits
// abnormally, with exponential backoff, up to MaxRestarts times. It
// returns nil when the task ended normally (or the run ended), and an
// error naming the task when it gave up.
func (s *supervisor) supervise(ctx context.Context, wg *sync.WaitGroup, i int, p *proc) error {
	backoff := s.c.RestartBackoff
	for restarts := 0; ; restarts++ {
		if !s.awaitExit(ctx, p) {
			return nil
		}
		exited := time.Now()
		s.account(p)
		switch s.judge(ctx, p) {
		case taskDone:
			return nil
		case taskFailed:
			if p.task.Type == cluster.Chief && p.cmd.ProcessState.ExitCode() == ExitChiefGaveUp {
				return fmt.Errorf("%w: %w", ErrChiefGaveUp, taskError(p))
			}
			return taskError(p)
		}
		s.mu.Lock()
		cause := p.cause
		if !p.killedAt.IsZero() {
			exited = p.killedAt
		}
		s.mu.Unlock()
		if cause == "" {
			cause = exitCause(p.cmd.ProcessState)
		}
		if restarts >= s.c.MaxRestarts {
			return fmt.Errorf("%w; gave up after %d restarts (--max-restarts)", taskError(p), restarts)
		}
		s.c.Log.Warn("task failed; restarting it", "task", p.task, "cause", cause, "err", exitText(p), "at", s.since(exited),
			"in", backoff, "restart", restarts+1)
		np, err := s.restart(ctx, wg, i, p.task, backoff)
		if np == nil {
			return err
		}
		backoff = min(2*backoff, 5*time.Second)
		s.mu.Lock()
		s.restarts = append(s.restarts, restart{task: p.task.String(), cause: cause, exitedAt: exited, backAt: time.Now()})
		s.mu.Unlock()
		p = np
	}
}

// awaitExit waits for p's process to exit and says so; if ctx ends
// first, it stops the process (SIGTERM, then SIGKILL after 5 s), counts
// its resource use and returns false.
func (s *supervisor) awaitExit(ctx context.Context, p *proc) bool {
	select {
	case <-p.done:
		return true
	case <-ctx.Done():
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	s.account(p)
	return false
}

// restart starts task t (index i) again after backoff, unless the run
// ends meanwhile (then it returns nil, nil). A chief restarted while the
// run is being interrupted adopts the cluster and is asked to stop it
// cleanly once it is up.
func (s *supervisor) restart(ctx context.Context, wg *sync.WaitGroup, i int, t cluster.Task, backoff time.Duration) (*proc, error) {
	select {
	case <-time.After(backoff):
	case <-ctx.Done():
		return nil, nil
	}
	isChief := t.Type == cluster.Chief
	if s.isFinished() || (s.stopping() && !isChief) || ctx.Err() != nil {
		return nil, nil // the run ended during the backoff
	}
	np, err := s.start(ctx, wg, i, t)
	if err != nil {
		return nil, err
	}
	if isChief && s.stopping() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.stopWhenUp(ctx, np)
		}()
	}
	return np, nil
}

// exitText is how p's process ended ("exit status 0", "signal: killed").
func exitText(p *proc) string {
	if p.err != nil {
		return p.err.Error()
	}
	return p.cmd.ProcessState.String()
}

// account adds an exited process's resource use to its task's.
func (s *supervisor) account(p *proc) {
	u := usage(p.cmd.ProcessState)
	s.mu.Lock()
	defer s.mu.Unlock()
	name := p.task.String()
	old := s.usage[name]
	u.PeakRSSBytes = max(u.PeakRSSBytes, old.PeakRSSBytes)
	u.CPUSeconds += old.CPUSeconds
	u.Restarts = old.Restarts
	if _, seen := s.usage[name]; seen {
		u.Restarts++
	}
	s.usage[name] = u
}

// inject kills f.Task with SIGKILL at f.At after the cluster started,
// or, for a fault with a mark, f.At after reached is closed.
func (s *supervisor) inject(ctx context.Context, f Fault, reached <-chan struct{}) {
	from := s.t0
	if reached != nil {
		select {
		case <-reached:
			from = time.Now()
		case <-ctx.Done():
			return
		}
	}
	select {
	case <-time.After(time.Until(from.Add(f.At))):
	case <-ctx.Done():
		return
	}
	s.mu.Lock()
	p := s.procs[f.Task]
	finished := s.finished || s.interrupted
	now := time.Now()
	if p != nil && !finished && !hasExited(p) {
		p.cause, p.killedAt = CauseFault, now
	}
	s.mu.Unlock()
	if p == nil || finished {
		return
	}
	if hasExited(p) {
		s.c.Log.Warn("fault: task already exited", "task", f.Task)
		return
	}
	s.c.Log.Warn("fault: killing task with SIGKILL", "task", f.Task, "pid", p.cmd.Process.Pid, "at", s.since(now))
	p.cmd.Process.Kill()
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func usage(ps *os.ProcessState) report.Task {
	t := report.Task{ExitCode: ps.ExitCode()}
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		t.PeakRSSBytes = ru.Maxrss * 1024
		t.CPUSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	return t
}

// taskError describes a failed task with the end of its log.
func taskError(p *proc) error {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return fmt.Errorf("%s exited: %v\n--- last lines of %s ---\n%s", p.task, p.err, p.log, strings.Join(lines, "\n"))
}

// claimRunDir makes sure that no process of an earlier run on c.Dir is
// alive (or kills them, with c.KillStale) and records this launcher's
// pid file in pidDir.
func claimRunDir(ctx context.Context, c Config, pidDir string, fs procFS) error {
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		return err
	}
	stale, err := findStale(pidDir, fs)
	if err != nil {
		return err
	}
	if len(stale) > 0 {
		if !c.KillStale {
			return &StaleError{Dir: c.Dir, Tasks: stale}
		}
		for _, r := range stale {
			c.Log.Warn("killing a process of an earlier run on the run dir (--kill-stale)", "task", r.Task, "pid", r.PID)
		}
		if err := killStale(ctx, stale, fs, 10*time.Second); err != nil {
			return err
		}
		for _, r := range stale {
			os.Remove(pidFileName(pidDir, r.Task))
		}
	}
	// O_EXCL: of two launchers started together on one directory, one
	// fails here.
	f, err := os.OpenFile(pidFileName(pidDir, "launcher"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("run dir %s is in use by another pstrain run (%w)", c.Dir, err)
	}
	defer f.Close()
	b, _ := json.Marshal(fs.record("launcher", os.Getpid(), os.Args))
	_, err = f.Write(append(b, '\n'))
	return err
}

// runToken is the run's token file: file (checked), or a fresh token in
// dir.
func runToken(file, dir string) (string, error) {
	if file != "" {
		if _, err := auth.ReadTokenFile(file); err != nil {
			return "", err
		}
		return filepath.Abs(file)
	}
	path, err := filepath.Abs(filepath.Join(dir, auth.TokenFile))
	if err != nil {
		return "", err
	}
	t, err := auth.NewToken(nil)
	if err != nil {
		return "", err
	}
	return path, auth.WriteTokenFile(path, t)
}
