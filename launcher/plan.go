package launcher

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
)

// plan is what a local run launches, computed from its configuration and
// the ports reserved for it, before any process starts: the cluster
// file's addresses, each task's metrics and data-plane address, its
// command line, and which tasks start at once (the worker slots past
// --workers wait for a scale request). It is a plain value: the
// supervisor executes it.
type plan struct {
	// Files of the run directory the tasks are told about.
	clusterFile string
	chiefReport string
	statePath   string
	scaleFile   string
	logDir      string
	runID       string

	spec cluster.Spec
	// tasks is launchOrder(spec): a task's index here numbers its ports,
	// its metrics address and its Prometheus target.
	tasks   []cluster.Task
	metrics []string   // metrics address of tasks[i]
	args    [][]string // command line of tasks[i], without the binary
	// initial are the indexes in tasks started at launch.
	initial []int
	slots   int // worker slots (Run.WorkerSlots)
	psSlots int // PS slots (Run.PSSlots): the first --ps start at launch
}

// portCount is how many ports planRun needs for c: gRPC and metrics for
// every task, and a data plane for each PS and standby.
func portCount(c Config) int {
	r := c.Run
	return 2*(1+r.PSSlots()+r.WorkerSlots()+r.StandbySlots()) + r.PSSlots() + r.StandbySlots()
}

// planRun lays out the run of c (whose Run.MaxWorkers is already the
// slot count) on ports, which holds portCount(c) reserved ports: the
// gRPC addresses first, in launch order, then the metrics addresses,
// then the data planes (ps/0.., standby/0..). runID names the run to the
// chief.
func planRun(c Config, runID string, ports []int) (plan, error) {
	if len(ports) != portCount(c) {
		return plan{}, fmt.Errorf("launcher: the plan needs %d ports, got %d", portCount(c), len(ports))
	}
	r := c.Run
	p := plan{clusterFile: filepath.Join(c.Dir, "cluster.json"), chiefReport: filepath.Join(c.Dir, "chief-report.json"),
		statePath: filepath.Join(c.Dir, "chief-state.json"), scaleFile: filepath.Join(c.Dir, ScaleRequestFile),
		logDir: filepath.Join(c.Dir, "logs"), runID: runID, slots: r.WorkerSlots(), psSlots: r.PSSlots()}
	n := 1 + p.psSlots + p.slots + r.StandbySlots()
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(ports[i]) }
	p.spec.Chief = []string{addr(0)}
	for i := 0; i < p.psSlots; i++ {
		p.spec.PS = append(p.spec.PS, addr(1+i))
	}
	for i := 0; i < p.slots; i++ {
		p.spec.Worker = append(p.spec.Worker, addr(1+p.psSlots+i))
	}
	for i := 0; i < r.StandbySlots(); i++ {
		p.spec.Standby = append(p.spec.Standby, addr(1+p.psSlots+p.slots+i))
	}
	p.tasks = launchOrder(p.spec)
	dataPorts := ports[2*n:]
	for i, t := range p.tasks {
		m := addr(n + i)
		if c.MetricsPortBase > 0 {
			m = "127.0.0.1:" + strconv.Itoa(c.MetricsPortBase+i)
		}
		p.metrics = append(p.metrics, m)
		data := ""
		switch t.Type {
		case cluster.PS:
			data = "127.0.0.1:" + strconv.Itoa(dataPorts[t.Index])
		case cluster.Standby:
			data = "127.0.0.1:" + strconv.Itoa(dataPorts[p.psSlots+t.Index])
		}
		p.args = append(p.args, p.taskArgs(c, t, m, data))
		if startsAtLaunch(r, t) {
			p.initial = append(p.initial, i)
		}
	}
	return p, nil
}

// startsAtLaunch says task t starts with the run: the chief, the first
// --workers worker slots, the first --ps PS slots and their standbys
// (the other slots wait for a scale request).
func startsAtLaunch(r config.Run, t cluster.Task) bool {
	switch t.Type {
	case cluster.Worker:
		return t.Index < r.Workers
	case cluster.PS, cluster.Standby:
		return t.Index < r.PS
	}
	return true
}

// taskArgs is task t's command line: its role, the cluster file, its
// metrics and data-plane addresses, the chief's files, then the run's
// flags and the extra ones.
func (p plan) taskArgs(c Config, t cluster.Task, metricsAddr, dataAddr string) []string {
	args := []string{t.Type, "--cluster=" + p.clusterFile, "--metrics-addr=" + metricsAddr}
	if dataAddr != "" {
		args = append(args, "--data-addr="+dataAddr)
	}
	if t.Type != cluster.Chief {
		args = append(args, fmt.Sprintf("--index=%d", t.Index))
	} else {
		args = append(args, "--report="+p.chiefReport, "--progress", "--run-id="+p.runID, "--state-file="+p.statePath,
			"--scale-file="+p.scaleFile)
	}
	var child []string
	if c.ChildArgs != nil {
		child = c.ChildArgs(c.Run)
	}
	return append(append(args, child...), c.ExtraArgs...)
}

// metricsAddr is the metrics address of tasks[i].
func (p plan) metricsAddr(i int) string { return p.metrics[i] }

// psIndex is PS slot k's index in tasks.
func (p plan) psIndex(k int) int { return 1 + k }

// standbyIndex is standby slot k's index in tasks.
func (p plan) standbyIndex(k int) int { return 1 + len(p.spec.PS) + len(p.spec.Worker) + k }

// workerIndex is worker slot k's index in tasks.
func (p plan) workerIndex(k int) int { return 1 + len(p.spec.PS) + k }

// logPath is task t's log file.
func (p plan) logPath(t cluster.Task) string {
	return filepath.Join(p.logDir, strings.ReplaceAll(t.String(), "/", "-")+".log")
}
