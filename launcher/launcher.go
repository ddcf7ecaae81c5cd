// Package launcher runs a whole cluster on this machine as separate
// processes (`pstrain run`): it picks ports, writes the cluster file and
// the Prometheus file_sd targets, starts the chief, the PS shards and the
// workers, relays the chief's progress, watches every process, and
// assembles the report with each process's peak RSS and CPU time.
package launcher

import (
	"context"
	"encoding/json"

	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/report"
)

// Config describes the local run.
type Config struct {
	Run config.Run
	Exe string // the pstrain binary
	Dir string // run directory: cluster.json, logs/, chief-report.json
	// SDDir receives the Prometheus file_sd target file.
	SDDir string
	// MetricsPortBase: chief on base, ps/i on base+1+i, worker/i on
	// base+1+PS+i. 0 picks free ports.
	MetricsPortBase int
	// ChildArgs renders the run configuration as flags.
	ChildArgs func(config.Run) []string
	// ExtraArgs are passed to every child (e.g. --connect-timeout).
	ExtraArgs []string
	Progress  io.Writer // where the chief's progress goes
	Log       *slog.Logger
}

type proc struct {
	task    cluster.Task
	cmd     *exec.Cmd
	log     string
	done    chan struct{}
	err     error
	metrics string
}

// freePorts reserves n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("launcher: finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Run starts the cluster and waits for it to finish.
func Run(ctx context.Context, c Config) (*report.Report, error) {
	t0 := time.Now()
	r := c.Run
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(c.Dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	n := 1 + r.PS + r.Workers
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var spec cluster.Spec
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	spec.Chief = []string{addr(0)}
	for i := 0; i < r.PS; i++ {
		spec.PS = append(spec.PS, addr(1+i))
	}
	for i := 0; i < r.Workers; i++ {
		spec.Worker = append(spec.Worker, addr(1+r.PS+i))
	}
	metricsAddr := func(i int) string {
		if c.MetricsPortBase > 0 {
			return "127.0.0.1:" + strconv.Itoa(c.MetricsPortBase+i)
		}
		return "127.0.0.1:" + strconv.Itoa(ports[n+i])
	}
	clusterFile := filepath.Join(c.Dir, "cluster.json")
	if err := os.WriteFile(clusterFile, spec.JSON(), 0o644); err != nil {
		return nil, err
	}
	tasks := spec.Tasks()
	if err := writeTargets(c.SDDir, tasks, metricsAddr); err != nil {
		return nil, err
	}
	chiefReport := filepath.Join(c.Dir, "chief-report.json")
	os.Remove(chiefReport)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	procs := map[string]*proc{}
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	start := func(i int, t cluster.Task) error {
		args := []string{t.Type, "--cluster=" + clusterFile, "--metrics-addr=" + metricsAddr(i)}
		if t.Type != cluster.Chief {
			args = append(args, fmt.Sprintf("--index=%d", t.Index))
		} else {
			args = append(args, "--report="+chiefReport, "--progress")
		}
		args = append(append(args, c.ChildArgs(r)...), c.ExtraArgs...)
		cmd := exec.Command(c.Exe, args...)
		cmd.Env = append(os.Environ(), "OPENBLAS_NUM_THREADS=1")
		logPath := filepath.Join(c.Dir, "logs", strings.ReplaceAll(t.String(), "/", "-")+".log")
		lf, err := os.Create(logPath)
		if err != nil {
			return err
		}
		cmd.Stderr = lf
		cmd.Stdout = lf
		if t.Type == cluster.Chief && c.Progress != nil {
			cmd.Stdout = c.Progress
		}
		if err := cmd.Start(); err != nil {
			lf.Close()
			return fmt.Errorf("launcher: starting %s: %w", t, err)
		}
		p := &proc{task: t, cmd: cmd, log: logPath, done: make(chan struct{}), metrics: metricsAddr(i)}
		procs[t.String()] = p
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.err = cmd.Wait()
			lf.Close()
			close(p.done)
		}()
		// Stop the process if the run is abandoned.
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-p.done:
			case <-ctx.Done():
				cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-p.done:
				case <-time.After(5 * time.Second):
					cmd.Process.Kill()
				}
			}
		}()
		return nil
	}
	for i, t := range tasks {
		if err := start(i, t); err != nil {
			return nil, err
		}
	}
	c.Log.Info("cluster started", "chief", spec.Chief[0], "ps", len(spec.PS), "workers", len(spec.Worker), "logs", filepath.Join(c.Dir, "logs"))

	// Wait for the chief; a task that fails first fails the run.
	chief := procs[cluster.Chief]
	failed := make(chan *proc, len(procs))
	for _, p := range procs {
		if p == chief {
			continue
		}
		go func() {
			select {
			case <-p.done:
				if p.err != nil {
					failed <- p
				}
			case <-chief.done:
			}
		}()
	}
	select {
	case <-chief.done:
		if chief.err != nil {
			return nil, taskError(chief)
		}
	case p := <-failed:
		return nil, taskError(p)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// The chief shut the PS down; workers exit when they see training done.
	grace := time.After(15 * time.Second)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-grace:
			c.Log.Warn("task did not exit after training; killing it", "task", p.task)
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	rep, err := report.Read(chiefReport)
	if err != nil {
		return nil, fmt.Errorf("launcher: the chief finished without a report: %w", err)
	}
	if rep.TrainStartedUnix > 0 {
		rep.StartupSeconds = rep.TrainStartedUnix - float64(t0.UnixNano())/1e9
	}
	rep.Tasks = map[string]report.Task{}
	for name, p := range procs {
		rep.Tasks[name] = usage(p.cmd.ProcessState)
	}
	return rep, nil
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

// writeTargets writes the Prometheus file_sd file for the tasks.
func writeTargets(dir string, tasks []cluster.Task, addr func(int) string) error {
	if dir == "" {
		return nil
	}
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var gs []group
	for i, t := range tasks {
		gs = append(gs, group{Targets: []string{addr(i)}, Labels: map[string]string{"role": t.Type, "task": t.String()}})
	}
	b, _ := json.MarshalIndent(gs, "", "  ")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".pstrain.json.tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "pstrain.json"))
}
