package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/tools/netlab"
)

// NetlabLink is a LinkRunner: a netlab lab of two hosts (network
// namespaces joined by veth links through a bridge), the chief and ps/0
// on the first, worker/0 on the second, each task a process of the
// pstrain binary Exe started with `ip netns exec`. Plaintext runs pass
// --insecure (the addresses are not loopback); TLS runs --tls-dir, with
// certificates `pstrain certs` made for the cluster file, and the
// integrity-only runs --data-plane-privacy integrity too. All use the
// same token.
type NetlabLink struct {
	Exe     string
	Dir     string // work directory: the cluster file, certificates, each run's logs
	DataDir string

	lab     *netlab.Lab
	cluster string // the cluster file
	certs   string // the certificate directory (and the token)
	n       int
}

// Kind implements LinkRunner.
func (l *NetlabLink) Kind() string {
	if l.lab == nil {
		return ""
	}
	return l.lab.Kind.String() + ", no impairment"
}

// Prepare builds the lab and the cluster's files; ErrSkip when this
// machine cannot (not root, no `ip`, namespaces refused).
func (l *NetlabLink) Prepare(ctx context.Context) error {
	if err := netlab.Prereq(); err != nil {
		return fmt.Errorf("%w: %v", ErrSkip, err)
	}
	lab, err := netlab.New(ctx, netlab.Config{Hosts: 2, Link: netlab.LinkVeth})
	if errors.Is(err, netlab.ErrNetnsRefused) {
		return fmt.Errorf("%w: %v", ErrSkip, err)
	}
	if err != nil {
		return fmt.Errorf("bench: tls link: %w", err)
	}
	l.lab = lab
	a, b := lab.Hosts[0].IP, lab.Hosts[1].IP
	spec := map[string][]string{"chief": {a + ":24100"}, "ps": {a + ":24200"}, "worker": {b + ":24300"}}
	if l.cluster, err = writeClusterFile(l.Dir, "link-cluster.json", spec); err != nil {
		return err
	}
	l.certs = filepath.Join(l.Dir, "link-certs")
	out, err := exec.CommandContext(ctx, l.Exe, "certs", "--cluster", l.cluster, "--out", l.certs).CombinedOutput()
	if err != nil {
		return fmt.Errorf("bench: pstrain certs: %w: %s", err, out)
	}
	return nil
}

// writeClusterFile writes spec, a cluster file's tasks by type, as
// dir/name and returns its path.
func writeClusterFile(dir, name string, spec map[string][]string) (string, error) {
	js, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, js, 0o644); err != nil {
		return "", fmt.Errorf("bench: %w", err)
	}
	return path, nil
}

// Close removes the lab.
func (l *NetlabLink) Close() error {
	if l.lab == nil {
		return nil
	}
	return l.lab.Close()
}

// Run trains for epochs and returns the chief's samples per second and
// the CPU time of the three processes per sample.
func (l *NetlabLink) Run(ctx context.Context, mode LinkMode, epochs float64) (float64, float64, error) {
	l.n++
	dir := filepath.Join(l.Dir, fmt.Sprintf("link%02d", l.n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, 0, fmt.Errorf("bench: %w", err)
	}
	rep := filepath.Join(dir, "report.json")
	common := []string{"--cluster", l.cluster, "--data-dir", l.DataDir, "--epochs", strconv.FormatFloat(epochs, 'g', -1, 64),
		"--target-accuracy", "0", "--eval-every", "0", "--ps", "1", "--workers", "1"}
	switch mode {
	case LinkTLS:
		common = append(common, "--tls-dir", l.certs)
	case LinkIntegrity:
		common = append(common, "--tls-dir", l.certs, "--data-plane-privacy", string(config.Integrity))
	default:
		common = append(common, "--insecure", "--auth-token-file", filepath.Join(l.certs, "auth-token"))
	}
	tasks := []struct {
		host *netlab.Host
		args []string
	}{
		{l.lab.Hosts[0], append([]string{"ps", "--index", "0", "--checkpoint-dir", filepath.Join(dir, "ckpt")}, common...)},
		{l.lab.Hosts[1], append([]string{"worker", "--index", "0"}, common...)},
		{l.lab.Hosts[0], append([]string{"chief", "--report", rep, "--checkpoint-dir", filepath.Join(dir, "ckpt")}, common...)},
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var cmds []*exec.Cmd
	cpu := 0.0 // seconds, of the tasks that ended
	stopAll := func() {
		for _, c := range cmds {
			c.Process.Signal(syscall.SIGTERM)
			c.Wait()
			cpu += c.ProcessState.UserTime().Seconds() + c.ProcessState.SystemTime().Seconds()
		}
		cmds = nil
	}
	defer stopAll()
	for i, t := range tasks {
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("task%d.log", i)))
		if err != nil {
			return 0, 0, fmt.Errorf("bench: %w", err)
		}
		defer logf.Close()
		c := t.host.Command(rctx, l.Exe, t.args...)
		c.Stdout, c.Stderr = logf, logf
		c.WaitDelay = 10 * time.Second
		if err := c.Start(); err != nil {
			return 0, 0, fmt.Errorf("bench: %w", err)
		}
		if i < len(tasks)-1 {
			cmds = append(cmds, c)
			continue
		}
		if err := c.Wait(); err != nil {
			return 0, 0, fmt.Errorf("bench: link run (%s): the chief: %w; logs in %s", mode, err, dir)
		}
		cpu += c.ProcessState.UserTime().Seconds() + c.ProcessState.SystemTime().Seconds()
	}
	stopAll() // the PS and the worker end with the run: their CPU counts
	r, err := report.Read(rep)
	if err != nil {
		return 0, 0, fmt.Errorf("bench: %w (logs in %s)", err, dir)
	}
	samples := r.SamplesPerSecond * r.TrainSeconds
	if samples <= 0 {
		return r.SamplesPerSecond, 0, nil
	}
	return r.SamplesPerSecond, cpu / samples, nil
}
