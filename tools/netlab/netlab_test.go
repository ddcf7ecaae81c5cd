package netlab

// Multi-host tests on one machine: chief, PS and workers of the real
// pstrain binary, each in its own network namespace with its own IP,
// under added latency and loss, and across partitions.
//
// When they run: as root with iproute2 (CI: .ci/run -> make test). Not
// root, or `ip`/`tc` missing: skipped with the reason, except under
// CI=true, where that is a failure (CI is root and scripts/setup.sh
// installs iproute2, so it would mean these tests silently stopped
// running). The one case that skips even under CI is a kernel or sandbox
// that refuses network namespaces altogether (ErrNetnsRefused: no
// CONFIG_NET_NS, or a container without CAP_SYS_ADMIN): nothing in the
// repository can fix that. Any other failure to build a lab fails.
//
// Without sch_netem in the kernel (this machine's kernel has neither
// CONFIG_NET_SCH_NETEM nor loadable modules), the latency/loss test uses
// LinkWire, the user-space netem of this package; the partition tests
// use kernel veth pairs always.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/transport/auth"
)

// bin is the pstrain binary the lab's hosts run.
var bin testbin.Binary

func TestMain(m *testing.M) {
	// Helper process: an echo server inside a namespace (TestLab).
	if addr := os.Getenv("NETLAB_ECHO"); addr != "" {
		echoServer(addr)
		return
	}
	code := m.Run()
	bin.Remove()
	os.Exit(code)
}

// lab builds a lab for t, or skips/fails as the file comment says. It is
// closed (and checked to leave nothing behind) when t ends.
func lab(t *testing.T, cfg Config) *Lab {
	t.Helper()
	ci := os.Getenv("CI") == "true"
	if err := Prereq(); err != nil {
		if ci {
			t.Fatalf("%v (CI=true: these tests must run in CI)", err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := New(ctx, cfg)
	if errors.Is(err, ErrNetnsRefused) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		if left := l.Leftovers(context.Background()); len(left) > 0 {
			t.Errorf("lab %s left behind: %v", l.Prefix, left)
		}
	})
	t.Logf("lab %s: %d hosts in %s, links %s", l.Prefix, len(l.Hosts), l.Subnet, l.Kind)
	return l
}

// TestLab checks the lab itself: reachability, a delay that shows in the
// round trip, a cut that silences a host, a heal, and a clean teardown,
// for both kinds of link (veth only where the kernel has netem).
func TestLab(t *testing.T) {
	for _, kind := range []LinkKind{LinkVeth, LinkWire} {
		t.Run(kind.String(), func(t *testing.T) {
			l := lab(t, Config{Hosts: 2, Link: kind})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			h := l.Hosts[0]
			addr := net.JoinHostPort(h.IP, "7777")
			cmd := h.Command(ctx, os.Args[0])
			cmd.Env = append(os.Environ(), "NETLAB_ECHO="+addr)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			// From the root namespace (the bridge's address) and from the
			// other host.
			rtt := waitEcho(t, ctx, addr)
			t.Logf("round trip to %s: %v", addr, rtt)
			client := l.Hosts[1].Command(ctx, os.Args[0], "-test.run=^TestEchoClient$")
			client.Env = append(os.Environ(), "NETLAB_ECHO_TARGET="+addr)
			out, err := client.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "PASS") {
				t.Fatalf("from %s: %v\n%s", l.Hosts[1].NS, err, out)
			}
			if err := l.Impair(ctx, h, Impairment{Delay: 20 * time.Millisecond}); err != nil {
				if kind == LinkVeth && strings.Contains(err.Error(), "no netem") {
					t.Log(err)
				} else {
					t.Fatal(err)
				}
			} else {
				d := minRTT(t, addr, 5)
				t.Logf("round trip with 20ms delay: %v", d)
				if d < 20*time.Millisecond || d > 200*time.Millisecond {
					t.Errorf("round trip %v with a 20ms delay towards the host", d)
				}
				if err := l.Clear(ctx, h); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Cut(ctx, h); err != nil {
				t.Fatal(err)
			}
			if c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond); err == nil {
				c.Close()
				t.Fatal("dialled a host that is cut off")
			}
			if err := l.Heal(ctx, h); err != nil {
				t.Fatal(err)
			}
			waitEcho(t, ctx, addr)
		})
	}
}

// TestEchoClient runs inside a namespace (TestLab): it reaches the echo
// server of the other host.
func TestEchoClient(t *testing.T) {
	addr := os.Getenv("NETLAB_ECHO_TARGET")
	if addr == "" {
		t.Skip("helper for TestLab")
	}
	if _, err := echoOnce(addr); err != nil {
		t.Fatal(err)
	}
}

func echoServer(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() { io.Copy(c, c); c.Close() }()
	}
}

func echoOnce(addr string) (time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	t0 := time.Now()
	if _, err := c.Write([]byte("x")); err != nil {
		return 0, err
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

func waitEcho(t *testing.T, ctx context.Context, addr string) time.Duration {
	t.Helper()
	for {
		d, err := echoOnce(addr)
		if err == nil {
			return d
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never answered: %v", addr, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func minRTT(t *testing.T, addr string, n int) time.Duration {
	t.Helper()
	best := time.Hour
	for range n {
		d, err := echoOnce(addr)
		if err != nil {
			t.Fatal(err)
		}
		best = min(best, d)
	}
	return best
}

// --- the pstrain cluster in namespaces ------------------------------------

// cluster is a pstrain cluster laid out on a lab: host 0 runs the chief,
// hosts 1..P the PS, then the workers.
type cluster struct {
	t     *testing.T
	lab   *Lab
	dir   string
	file  string
	flags []string
	ps    int
	procs map[string]*proc
	mu    sync.Mutex
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

const basePort = 7000

func newCluster(t *testing.T, l *Lab, ps, workers int, flags ...string) *cluster {
	t.Helper()
	if len(l.Hosts) != 1+ps+workers {
		t.Fatalf("lab has %d hosts, cluster needs %d", len(l.Hosts), 1+ps+workers)
	}
	c := &cluster{t: t, lab: l, dir: t.TempDir(), ps: ps, procs: map[string]*proc{}}
	spec := map[string][]string{"chief": {net.JoinHostPort(l.Hosts[0].IP, strconv.Itoa(basePort))}}
	for i := range ps {
		spec["ps"] = append(spec["ps"], net.JoinHostPort(l.Hosts[1+i].IP, strconv.Itoa(basePort)))
	}
	for i := range workers {
		spec["worker"] = append(spec["worker"], net.JoinHostPort(l.Hosts[1+ps+i].IP, strconv.Itoa(basePort)))
	}
	b, _ := json.Marshal(spec)
	c.file = filepath.Join(c.dir, "cluster.json")
	if err := os.WriteFile(c.file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(c.dir, auth.TokenFile)
	if _, err := auth.EnsureTokenFile(token); err != nil {
		t.Fatal(err)
	}
	c.flags = append([]string{"--cluster", c.file, "--insecure", "--auth-token-file", token, "--ps", strconv.Itoa(ps), "--workers", strconv.Itoa(workers),
		"--data-dir", testbin.MNIST(t), "--data-fraction", "0.2", "--target-accuracy", "0", "--eval-every", "1s",
		"--heartbeat-timeout", "2s", "--connect-timeout", "45s",
		"--checkpoint-dir", filepath.Join(c.dir, "ckpt"), "--checkpoint-every", "1s"}, flags...)
	// Runs before the lab's cleanup (LIFO): no process is left in a
	// namespace being deleted.
	t.Cleanup(c.killAll)
	return c
}

func (c *cluster) host(task string) *Host {
	role, idx, _ := strings.Cut(task, "/")
	i, _ := strconv.Atoi(idx)
	switch role {
	case "chief":
		return c.lab.Hosts[0]
	case "ps":
		return c.lab.Hosts[1+i]
	}
	return c.lab.Hosts[1+c.ps+i]
}

// start runs task ("chief", "ps/1", "worker/0") in its namespace.
func (c *cluster) start(ctx context.Context, task string, extra ...string) *proc {
	c.t.Helper()
	role, idx, _ := strings.Cut(task, "/")
	args := append([]string{role}, c.flags...)
	if idx != "" {
		args = append(args, "--index", idx)
	}
	args = append(args, extra...)
	p := &proc{name: task, log: filepath.Join(c.dir, strings.ReplaceAll(task, "/", "-")+".log"), done: make(chan struct{})}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	p.cmd = c.host(task).Command(ctx, bin.Path(c.t), args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); f.Close(); close(p.done) }()
	c.mu.Lock()
	c.procs[task] = p
	c.mu.Unlock()
	return p
}

func (c *cluster) startAll(ctx context.Context, chiefArgs ...string) {
	c.start(ctx, "chief", chiefArgs...)
	for i := range c.ps {
		c.start(ctx, fmt.Sprintf("ps/%d", i))
	}
	for i := range len(c.lab.Hosts) - 1 - c.ps {
		c.start(ctx, fmt.Sprintf("worker/%d", i))
	}
}

func (c *cluster) killAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// wait waits for every process to exit and fails the test on an error exit.
func (c *cluster) wait(ctx context.Context) {
	c.t.Helper()
	c.mu.Lock()
	procs := c.procs
	c.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.done:
			if p.err != nil {
				c.t.Errorf("%s: %v\n%s", p.name, p.err, c.tail(p.name, 15))
			}
		case <-ctx.Done():
			c.t.Fatalf("%s did not finish: %v\n%s", p.name, ctx.Err(), c.tails())
		}
	}
}

func (c *cluster) logText(task string) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, strings.ReplaceAll(task, "/", "-")+".log"))
	return string(b)
}

func (c *cluster) tail(task string, n int) string {
	lines := strings.Split(strings.TrimSpace(c.logText(task)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (c *cluster) tails() string {
	var b strings.Builder
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.procs {
		fmt.Fprintf(&b, "--- %s\n%s\n", name, c.tail(name, 12))
	}
	return b.String()
}

// metric reads one unlabelled sample from task's /metrics (port + 1000).
// ok is false when the endpoint or the sample is not there.
func (c *cluster) metric(task, name string) (float64, bool) {
	url := fmt.Sprintf("http://%s/metrics", net.JoinHostPort(c.host(task).IP, strconv.Itoa(basePort+1000)))
	cl := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := cl.Get(url)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// poll calls cond every 100ms until it is true, or fails the test with
// what after timeout.
func (c *cluster) poll(ctx context.Context, timeout time.Duration, what string, cond func() bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			c.t.Fatalf("timed out after %v waiting for %s\n%s", timeout, what, c.tails())
		case <-tk.C:
		}
	}
}

func (c *cluster) step() float64 {
	v, _ := c.metric("chief", "pstrain_global_step")
	return v
}

func (c *cluster) report() *report.Report {
	c.t.Helper()
	rep, err := report.Read(filepath.Join(c.dir, "report.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	return rep
}

func (c *cluster) reportFlag() string { return "--report=" + filepath.Join(c.dir, "report.json") }

func long(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-host runs take tens of seconds")
	}
}

// TestLatencyAndLoss trains the default cluster (2 PS, 2 workers, sync)
// with every task's link delayed by 2 ms, then 20 ms, then with 1% loss:
// it converges each time, and the report shows what the latency costs.
func TestLatencyAndLoss(t *testing.T) {
	long(t)
	testbin.MNIST(t)
	bin.Path(t)
	conds := []struct {
		name string
		im   Impairment
	}{
		{"none", Impairment{}},
		{"delay2ms", Impairment{Delay: 2 * time.Millisecond}},
		{"delay20ms", Impairment{Delay: 20 * time.Millisecond}},
		{"loss1pct", Impairment{Loss: 0.01}},
	}
	sps, acc := map[string]float64{}, map[string]float64{}
	for _, cd := range conds {
		t.Run(cd.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			l := lab(t, Config{Hosts: 5, Link: LinkAuto})
			for _, h := range l.Hosts {
				if err := l.Impair(ctx, h, cd.im); err != nil {
					t.Fatal(err)
				}
			}
			c := newCluster(t, l, 2, 2, "--epochs", "2")
			t0 := time.Now()
			c.startAll(ctx, c.reportFlag())
			c.wait(ctx)
			rep := c.report()
			sps[cd.name], acc[cd.name] = rep.SamplesPerSecond, rep.TestAccuracy
			var drops int64
			for _, h := range l.Hosts {
				drops += l.Drops(h)
			}
			if cd.im.Loss > 0 {
				t.Logf("frames dropped by the links: %d", drops)
				if l.Kind == LinkWire && drops == 0 {
					t.Error("1% loss dropped no frame")
				}
			}
			t.Logf("%s (%s, %s): %d steps, test accuracy %.2f%%, %.0f samples/s, training %.1f s, startup %.1f s, wall %.1f s",
				cd.name, cd.im, l.Kind, rep.GlobalSteps, 100*rep.TestAccuracy, rep.SamplesPerSecond, rep.TrainSeconds, rep.StartupSeconds, time.Since(t0).Seconds())
			// 2 epochs of 20% of MNIST (ceil(12000/256) = 47 steps each):
			// 93.14% measured here under every condition (sync SGD with
			// every worker is deterministic: the network changes the time,
			// not the model); 0.90 leaves a margin.
			// The report's global_steps was once 93 with 20 ms of delay: in
			// sync mode the shards may be one step apart when training ends
			// (docs/semantics.md), and the chief's last reading can be the
			// lagging one.
			if rep.StoppedBy != "epochs" || rep.GlobalSteps < 93 || rep.GlobalSteps > 94 {
				t.Errorf("stopped by %s after %d steps, want epochs after 94", rep.StoppedBy, rep.GlobalSteps)
			}
			if rep.TestAccuracy < 0.90 {
				t.Errorf("test accuracy %.4f, want >= 0.90", rep.TestAccuracy)
			}
		})
	}
	for _, cd := range conds {
		if a, ok := acc[cd.name]; ok && (a-acc["none"] > 0.005 || acc["none"]-a > 0.005) {
			t.Errorf("%s: test accuracy %.4f, undisturbed %.4f: sync training should not depend on the network", cd.name, a, acc["none"])
		}
	}
	a, b := sps["delay2ms"], sps["delay20ms"]
	if a > 0 && b > 0 {
		t.Logf("samples/s: none %.0f, 2 ms %.0f, 20 ms %.0f (x%.2f slower than 2 ms), 1%% loss %.0f", sps["none"], a, b, a/b, sps["loss1pct"])
		if b >= a {
			t.Errorf("20 ms delay gave %.0f samples/s, not fewer than 2 ms (%.0f)", b, a)
		}
	}
}

// TestPartitionWorker cuts worker/1 off for 6 s in sync mode: the chief
// drops it from the live set, steps go on with worker/0 alone, and
// worker/1 rejoins after the heal.
func TestPartitionWorker(t *testing.T) {
	long(t)
	testbin.MNIST(t)
	bin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l := lab(t, Config{Hosts: 4, Link: LinkVeth})
	c := newCluster(t, l, 1, 2, "--epochs", "20")
	c.startAll(ctx, c.reportFlag())
	live := func() float64 { v, _ := c.metric("chief", "pstrain_live_workers"); return v }
	c.poll(ctx, 40*time.Second, "training with 2 live workers", func() bool { return c.step() >= 20 && live() == 2 })
	w1 := c.host("worker/1")
	cutAt := time.Now()
	if err := l.Cut(ctx, w1); err != nil {
		t.Fatal(err)
	}
	t.Logf("cut worker/1 at step %.0f", c.step())
	c.poll(ctx, 6*time.Second, "the chief to drop worker/1", func() bool { return live() == 1 })
	dropped := time.Since(cutAt)
	s0 := c.step()
	time.Sleep(6*time.Second - time.Since(cutAt)) // the partition's length, not a settling wait
	s1 := c.step()
	t.Logf("worker/1 dropped after %v; during the cut steps %.0f -> %.0f", dropped.Round(time.Millisecond), s0, s1)
	if s1 <= s0 {
		t.Errorf("no sync step during the partition (%.0f -> %.0f)", s0, s1)
	}
	if err := l.Heal(ctx, w1); err != nil {
		t.Fatal(err)
	}
	healAt := time.Now()
	w1steps, _ := c.metric("worker/1", "pstrain_worker_steps_total")
	c.poll(ctx, 20*time.Second, "worker/1 to rejoin", func() bool { return live() == 2 })
	c.poll(ctx, 20*time.Second, "worker/1 to step again", func() bool {
		v, ok := c.metric("worker/1", "pstrain_worker_steps_total")
		return ok && v > w1steps
	})
	t.Logf("worker/1 back in the live set and stepping %v after the heal (step %.0f)", time.Since(healAt).Round(time.Millisecond), c.step())
	c.wait(ctx)
	if log := c.logText("chief"); strings.Count(log, "live workers changed") < 2 {
		t.Errorf("the chief did not log both membership changes:\n%s", c.tail("chief", 30))
	}
	rep := c.report()
	t.Logf("finished: %d steps, %.2f%%, %.0f samples/s, stale gradients dropped %d", rep.GlobalSteps, 100*rep.TestAccuracy, rep.SamplesPerSecond, rep.StaleGradientsDropped)
	if rep.StoppedBy != "epochs" || rep.TestAccuracy < 0.93 {
		t.Errorf("stopped by %s at %.4f", rep.StoppedBy, rep.TestAccuracy)
	}
}

// TestPartitionPS cuts ps/1 off for 5 s: workers wait and retry (no
// crash, no hang), training resumes after the heal and finishes. Then
// ps/1 is cut again and killed with SIGKILL while cut off; restarted in
// its namespace, the chief restores it from the checkpoint.
func TestPartitionPS(t *testing.T) {
	long(t)
	testbin.MNIST(t)
	bin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	l := lab(t, Config{Hosts: 5, Link: LinkVeth})
	c := newCluster(t, l, 2, 2, "--epochs", "8")
	c.startAll(ctx, c.reportFlag())
	c.poll(ctx, 40*time.Second, "training and a checkpoint", func() bool {
		return c.step() >= 20 && strings.Contains(c.logText("chief"), "checkpoint committed")
	})
	ps1 := c.host("ps/1")
	cut := func() float64 {
		if err := l.Cut(ctx, ps1); err != nil {
			t.Fatal(err)
		}
		return c.step()
	}
	s0 := cut()
	time.Sleep(5 * time.Second) // the partition's length
	s1 := c.step()
	t.Logf("ps/1 cut for 5 s: global step %.0f -> %.0f", s0, s1)
	if s1 > s0+2 {
		t.Errorf("sync steps went on without ps/1 (%.0f -> %.0f)", s0, s1)
	}
	if err := l.Heal(ctx, ps1); err != nil {
		t.Fatal(err)
	}
	healAt := time.Now()
	c.poll(ctx, 30*time.Second, "training to resume after the heal", func() bool { return c.step() > s1+5 })
	t.Logf("training resumed %v after the heal", time.Since(healAt).Round(time.Millisecond))
	for _, w := range []string{"worker/0", "worker/1", "ps/0", "ps/1"} {
		select {
		case <-c.procs[w].done:
			t.Fatalf("%s exited during the partition: %v\n%s", w, c.procs[w].err, c.tail(w, 15))
		default:
		}
	}

	// Cut again, kill -9 the PS while it is unreachable, heal and restart it.
	s2 := cut()
	p := c.procs["ps/1"]
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	time.Sleep(3 * time.Second) // the partition's length
	if err := l.Heal(ctx, ps1); err != nil {
		t.Fatal(err)
	}
	c.start(ctx, "ps/1")
	c.poll(ctx, 40*time.Second, "the chief to restore ps/1", func() bool {
		return strings.Contains(c.logText("chief"), "parameter server restored")
	})
	s3 := c.step()
	c.poll(ctx, 30*time.Second, "training to resume after the restore", func() bool { return c.step() > s3+5 })
	t.Logf("ps/1 killed at step %.0f during a partition, restored (%s); training on at step %.0f", s2, lastLine(c.logText("chief"), "parameter server restored"), c.step())
	c.wait(ctx)
	rep := c.report()
	t.Logf("finished: %d steps, %.2f%%, %.0f samples/s, restarts %d", rep.GlobalSteps, 100*rep.TestAccuracy, rep.SamplesPerSecond, len(rep.Restarts))
	if rep.StoppedBy != "epochs" || rep.TestAccuracy < 0.93 {
		t.Errorf("stopped by %s at %.4f", rep.StoppedBy, rep.TestAccuracy)
	}
}

func lastLine(s, sub string) string {
	var last string
	for _, ln := range strings.Split(s, "\n") {
		if strings.Contains(ln, sub) {
			last = ln
		}
	}
	return last
}

// Close treats a link that vanished on its own as deleted, whichever
// moment it vanished at, and any other failure as one.
func TestGone(t *testing.T) {
	for out, want := range map[string]bool{
		`Cannot find device "pl55d8h0"`:              true,
		"RTNETLINK answers: No such device":          true,
		"RTNETLINK answers: Operation not permitted": false,
		"": false,
	} {
		if got := gone(out); got != want {
			t.Errorf("gone(%q) = %v, want %v", out, got, want)
		}
	}
}
