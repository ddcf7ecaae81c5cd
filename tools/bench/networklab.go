package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/tools/netlab"
	"github.com/pstrain/pstrain/transport/auth"
)

// NetlabCluster is a NetworkRunner: the default cluster (the chief, 2 PS
// and 2 workers), each task a process of the pstrain binary Exe on its
// own netlab host, every host's link rate-limited, delayed and lossy as
// the run's NetworkLink says. The lab is built on the first run (it
// needs root and /dev/net/tun) and kept until Close; its links are
// LinkWire (the rate limit is this package's user-space netem) with an
// MTU of 9000.
type NetlabCluster struct {
	Exe     string
	Dir     string // the cluster file, the token and each run's logs
	DataDir string

	lab     *netlab.Lab
	cluster string
	token   string
	n       int
}

const (
	netlabPS, netlabWorkers = 2, 2
	netlabMTU               = 9000
	netlabPort              = 7000
)

// Kind implements NetworkRunner.
func (c *NetlabCluster) Kind() string {
	return fmt.Sprintf("chief, %d PS and %d workers (sync, the defaults), each on its own netlab host; tap+userspace-netem links, MTU %d, rate each way, delay and loss towards each host",
		netlabPS, netlabWorkers, netlabMTU)
}

// prepare builds the lab and the cluster's files once.
func (c *NetlabCluster) prepare(ctx context.Context) error {
	if c.lab != nil {
		return nil
	}
	if err := netlab.Prereq(); err != nil {
		return fmt.Errorf("%w: %v", ErrSkip, err)
	}
	lab, err := netlab.New(ctx, netlab.Config{Hosts: 1 + netlabPS + netlabWorkers, Link: netlab.LinkWire, MTU: netlabMTU})
	if errors.Is(err, netlab.ErrNetnsRefused) {
		return fmt.Errorf("%w: %v", ErrSkip, err)
	}
	if err != nil {
		return fmt.Errorf("bench: network lab: %w", err)
	}
	c.lab = lab
	addr := func(h int) string { return net.JoinHostPort(lab.Hosts[h].IP, strconv.Itoa(netlabPort)) }
	spec := map[string][]string{"chief": {addr(0)}}
	for i := range netlabPS {
		spec["ps"] = append(spec["ps"], addr(1+i))
	}
	for i := range netlabWorkers {
		spec["worker"] = append(spec["worker"], addr(1+netlabPS+i))
	}
	if c.cluster, err = writeClusterFile(c.Dir, "network-cluster.json", spec); err != nil {
		return err
	}
	c.token = filepath.Join(c.Dir, auth.TokenFile)
	if _, err := auth.EnsureTokenFile(c.token); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// Close removes the lab.
func (c *NetlabCluster) Close() error {
	if c.lab == nil {
		return nil
	}
	return c.lab.Close()
}

// Run implements NetworkRunner: the PS and the workers start, then the
// chief, which is interrupted after limit (it then hands back its model
// and writes its report); the other tasks get 20 s to end by themselves
// after the chief, then SIGTERM.
func (c *NetlabCluster) Run(ctx context.Context, link NetworkLink, limit time.Duration, args []string) (*report.Report, error) {
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	im := netlab.Impairment{Rate: link.Rate, Delay: link.Delay, Loss: link.Loss}
	for _, h := range c.lab.Hosts {
		if err := c.lab.Impair(ctx, h, im); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	c.n++
	dir := filepath.Join(c.Dir, fmt.Sprintf("net%02d-%s", c.n, link.Name))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	rep := filepath.Join(dir, "report.json")
	common := append([]string{"--cluster", c.cluster, "--insecure", "--auth-token-file", c.token, "--data-dir", c.DataDir,
		"--ps", strconv.Itoa(netlabPS), "--workers", strconv.Itoa(netlabWorkers), "--connect-timeout", "60s",
		"--checkpoint-dir", filepath.Join(dir, "ckpt")}, args...)
	rctx, cancel := context.WithTimeout(ctx, limit+2*time.Minute)
	defer cancel()
	var others []*exec.Cmd
	defer func() { stopTasks(others, 20*time.Second) }()
	for i := range netlabPS + netlabWorkers {
		role, idx, host := "ps", i, 1+i
		if i >= netlabPS {
			role, idx = "worker", i-netlabPS
		}
		cmd, err := c.start(rctx, dir, host, fmt.Sprintf("%s-%d", role, idx), append([]string{role, "--index", strconv.Itoa(idx)}, common...))
		if err != nil {
			return nil, err
		}
		others = append(others, cmd)
	}
	chief, err := c.start(rctx, dir, 0, "chief", append([]string{"chief", "--report", rep}, common...))
	if err != nil {
		return nil, err
	}
	capped := time.AfterFunc(limit, func() { chief.Process.Signal(syscall.SIGINT) })
	werr := chief.Wait()
	interrupted := !capped.Stop()
	if werr != nil && !interrupted {
		return nil, fmt.Errorf("bench: network run: the chief: %w; logs in %s", werr, dir)
	}
	r, err := report.Read(rep)
	if err != nil {
		return nil, fmt.Errorf("bench: %w (logs in %s)", err, dir)
	}
	return r, nil
}

// start runs one task on host h, its output in dir/name.log.
func (c *NetlabCluster) start(ctx context.Context, dir string, h int, name string, args []string) (*exec.Cmd, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	cmd := c.lab.Hosts[h].Command(ctx, c.Exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.WaitDelay = 10 * time.Second
	err = cmd.Start()
	logf.Close() // the child holds its own descriptor
	if err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", name, err)
	}
	return cmd, nil
}

// stopTasks waits up to grace for the tasks to end by themselves, then
// sends SIGTERM to those still running and waits for them.
func stopTasks(cmds []*exec.Cmd, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		for _, c := range cmds {
			c.Wait()
		}
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	for _, c := range cmds {
		c.Process.Signal(syscall.SIGTERM)
	}
	<-done
}
