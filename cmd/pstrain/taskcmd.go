package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"time"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/launcher"
	"github.com/pstrain/pstrain/task"
	"github.com/pstrain/pstrain/worker"
)

const taskAbout = `: the cluster comes from --cluster FILE or the
TF_CONFIG environment variable (Kubeflow's TFJob sets it; "master" is read as
the chief). --ps, --workers, --ps-replicas and the index default to the
cluster's; the run flags must agree with the chief's. A standby is the second
process of a shard (--ps-replicas 1): it runs the PS code and takes over when
the chief promotes it.`

// taskCmd is the command line of one task of a cluster (`pstrain chief`,
// `ps`, `standby`, `worker`, or `task` with the role from the cluster).
type taskCmd struct {
	fs   *flag.FlagSet
	role string // "" for `pstrain task`
	r    config.Run
	mf   *modelFlags

	clusterFile, metricsAddr, dataAddr, logLevel, hostMetrics string
	reportPath, runID, statePath, scaleFile, faultGradient    string
	webConfig, tokenFile                                      *string
	index, maxMsgMB, blasThreads                              int
	connectTimeout                                            time.Duration
	progress, summary                                         bool
	lim                                                       limitFlags
	tlsF                                                      *tlsFlags
}

// newTaskCmd registers the flags of role's command.
func newTaskCmd(role string) *taskCmd {
	name, about := role, "Run one task of a cluster"
	if role == "" {
		name, about = "task", "Run the task that TF_CONFIG (or the cluster file's \"task\") names"
	}
	c := &taskCmd{fs: newFlagSet(name, name+" [flags]", about+taskAbout), role: role, r: config.Default()}
	fs := c.fs
	c.mf = bindRunFlags(fs, &c.r)
	fs.StringVar(&c.clusterFile, "cluster", "", "cluster file (JSON: {\"chief\":[..],\"ps\":[..],\"worker\":[..]}); default: the TF_CONFIG environment variable")
	fs.IntVar(&c.index, "index", -1, "this task's index (-1: from TF_CONFIG or the cluster file's task)")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "serve /metrics and /healthz here (default: the task's port + 1000; \"off\" disables)")
	c.webConfig = bindWebConfigFlag(fs, "")
	fs.StringVar(&c.dataAddr, "data-addr", "", "ps: where the TCP data plane listens (default: the task's port + 2000)")
	fs.DurationVar(&c.connectTimeout, "connect-timeout", time.Minute, "how long to wait for the chief or a PS before giving up")
	fs.IntVar(&c.maxMsgMB, "max-message-mb", 256, "largest gRPC message accepted, in MiB")
	c.lim = bindLimitFlags(fs)
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.IntVar(&c.blasThreads, "blas-threads", 1, "worker: OpenBLAS threads (1 avoids oversubscribing shared cores)")
	fs.StringVar(&c.reportPath, "report", "", "chief: write the run report (JSON) here")
	fs.BoolVar(&c.progress, "progress", false, "chief: print a progress line every second, and its warnings and errors, on stdout")
	fs.StringVar(&c.hostMetrics, "host-metrics", "auto", "export the host's load, CPU and memory (pstrain_host_*): auto (only the cluster's first task on this task's host), on or off (e.g. where node_exporter runs)")
	fs.BoolVar(&c.summary, "summary", true, "chief: print the run's summary on stdout at the end (pstrain run prints its own)")
	fs.StringVar(&c.runID, "run-id", "", "chief: run identifier (default: generated; give one so that a restarted chief can adopt its running cluster)")
	fs.StringVar(&c.statePath, "state-file", "", "chief: keep the report's history here so that a restarted chief can finish it")
	fs.StringVar(&c.scaleFile, "scale-file", "", "chief: change the worker count when this JSON file ({\"workers\": N}) changes (pstrain scale writes it; docs/elastic.md)")
	fs.StringVar(&c.faultGradient, "fault-gradient", "", "testing: worker/I@STEP:SCALE multiplies worker I's gradient by SCALE once, at global step STEP (worker/I@every:SCALE: every step); other tasks ignore it")
	c.tlsF = bindTLSFlags(fs)
	c.tokenFile = bindTokenFlag(fs)
	for _, f := range []string{"ps", "workers", "ps-replicas"} {
		fl := fs.Lookup(f)
		fl.DefValue, fl.Usage = "0", fl.Usage+" (default: the cluster's)"
	}
	return c
}

// cmdTask runs one task of a cluster: role is the command's, or "" for
// `pstrain task` (the role comes from TF_CONFIG or the cluster file).
func cmdTask(ctx context.Context, role string, args []string, stdout, stderr io.Writer) error {
	c := newTaskCmd(role)
	if err := parse(c.fs, args, stdout); err != nil {
		return err
	}
	o, err := c.options(stdout, stderr)
	if err != nil {
		return err
	}
	return c.execute(ctx, o, stdout)
}

// resolve checks the task's own flags, finds the task in the cluster and
// completes the run's configuration from it: the run's flags are
// validated once --ps and --workers are known (from the cluster when not
// given). It returns the cluster, the task and its address.
func (c *taskCmd) resolve() (cluster.Spec, cluster.Task, string, error) {
	fail := func(err error) (cluster.Spec, cluster.Task, string, error) {
		return cluster.Spec{}, cluster.Task{}, "", err
	}
	if err := positive("connect-timeout", c.connectTimeout); err != nil {
		return fail(err)
	}
	if err := c.lim.validate(); err != nil {
		return fail(asUsage(err))
	}
	spec, t, err := loadCluster(c.clusterFile, os.Getenv("TF_CONFIG"))
	if err != nil {
		return fail(err)
	}
	tk, err := resolveTask(c.role, c.index, t)
	if err != nil {
		return fail(err)
	}
	addr, err := spec.Addr(tk)
	if err != nil {
		return fail(asUsage(err)) // --index out of the cluster's range
	}
	if err := shapeFromCluster(&c.r, spec, flagSet(c.fs, "ps"), flagSet(c.fs, "workers")); err != nil {
		return fail(err)
	}
	if err := replicasFromCluster(&c.r, spec, flagSet(c.fs, "ps-replicas")); err != nil {
		return fail(err)
	}
	// The default learning rate and the checks, with the cluster's counts.
	c.mf.defaultLR()
	if err := c.r.Validate(); err != nil {
		return fail(asUsage(err))
	}
	return spec, tk, addr, nil
}

// addrs is where task tk (at addr) serves its metrics ("" = nowhere) and,
// for a shard, its data plane, by default next to its port.
func (c *taskCmd) addrs(tk cluster.Task, addr string) (metricsAddr, dataAddr string, err error) {
	ma := c.metricsAddr
	switch ma {
	case "off":
		ma = ""
	case "":
		if ma, err = task.DefaultMetricsAddr(addr); err != nil {
			return "", "", err
		}
	}
	da := c.dataAddr
	if da == "" && (tk.Type == cluster.PS || tk.Type == cluster.Standby) {
		if da, err = task.DefaultDataAddr(addr); err != nil {
			return "", "", err
		}
	}
	return ma, da, nil
}

// options turns the command line into the task's options: the cluster,
// the task, the checked run, its addresses, logger, TLS and token.
func (c *taskCmd) options(stdout, stderr io.Writer) (task.Options, error) {
	spec, tk, addr, err := c.resolve()
	if err != nil {
		return task.Options{}, err
	}
	gradFaults, err := worker.ParseGradientFaults(c.faultGradient, c.r.Workers)
	if err != nil {
		return task.Options{}, asUsage(err)
	}
	// The process's identity is "self": "task" is left to lines about a
	// task (the chief's "task registered task=ps/0").
	log, err := taskLogger(stderr, stdout, c.logLevel, tk.Type == cluster.Chief && c.progress, "self", tk.String())
	if err != nil {
		return task.Options{}, err
	}
	ma, da, err := c.addrs(tk, addr)
	if err != nil {
		return task.Options{}, err
	}
	hm, err := hostMetricsOn(c.hostMetrics, spec, tk)
	if err != nil {
		return task.Options{}, err
	}
	if err := checkTask(c.r, spec, tk, ma, da); err != nil {
		return task.Options{}, err
	}
	o := task.Options{Cluster: spec, Task: tk, Run: c.r, MetricsAddr: ma, HostMetrics: hm, DataAddr: c.dataAddr, ConnectTimeout: c.connectTimeout,
		MaxMessageBytes: c.maxMsgMB << 20, Log: log, GradientFaults: gradFaults, WebConfigFile: *c.webConfig}
	c.lim.apply(&o)
	if o.TLS, err = c.tlsF.load(spec, tk, c.r.DataPlanePrivacy, log); err != nil {
		return task.Options{}, err
	}
	if o.Auth, err = loadToken(*c.tokenFile, *c.tlsF.dir); err != nil {
		return task.Options{}, err
	}
	return o, nil
}

// execute runs the task o describes; a chief prints the summary and
// exits as its report says.
func (c *taskCmd) execute(ctx context.Context, o task.Options, stdout io.Writer) error {
	switch o.Task.Type {
	case cluster.PS, cluster.Standby:
		return task.RunPS(ctx, o)
	case cluster.Worker:
		return task.RunWorker(ctx, o, c.blasThreads)
	}
	co := task.ChiefOptions{RunID: c.runID, ReportPath: c.reportPath, StatePath: c.statePath, ScaleFile: c.scaleFile}
	if c.progress {
		co.Progress = stdout
	}
	rep, err := task.RunChief(ctx, o, co)
	if errors.Is(err, chief.ErrGaveUp) {
		return &exitError{code: launcher.ExitChiefGaveUp, err: err}
	}
	if err != nil {
		return err
	}
	if c.summary {
		printSummary(stdout, rep)
	}
	return runEnd(rep)
}
