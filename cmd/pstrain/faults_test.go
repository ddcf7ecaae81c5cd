package main

// Multi-process tests of the faults a SIGKILL does not cover:
// a frozen PS (SIGSTOP), a PS that exits 0 in the middle of the run, the
// launcher itself killed, a second launcher on the same run directory,
// and two PS killed close together, with the report's times checked
// against the fault log's.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pstrain/pstrain/internal/syncbuf"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
)

// liveRun is a `pstrain run` in the background.
type liveRun struct {
	t      *testing.T
	dir    string // its --run-dir
	cmd    *exec.Cmd
	out    *syncbuf.Buffer // stdout and stderr
	moving chan struct{}   // closed at the first progress line past step 0
	done   chan struct{}   // closed when it has exited; then err is set
	err    error
}

// startRun starts `pstrain run` on run dir dir/run (report dir/report.json)
// with the common flags of faultRun and args.
func startRun(t *testing.T, ctx context.Context, dir string, args ...string) *liveRun {
	t.Helper()
	base := []string{"run", "--data-dir", testbin.MNIST(t), "--target-accuracy", "0", "--eval-every", "0",
		"--run-dir", filepath.Join(dir, "run"), "--sd-dir", filepath.Join(dir, "targets"), "--report", filepath.Join(dir, "report.json"),
		"--checkpoint-every", "1s", "--heartbeat-timeout", "2s"}
	cmd := exec.CommandContext(ctx, bin.Path(t), append(base, args...)...)
	r := &liveRun{t: t, dir: filepath.Join(dir, "run"), cmd: cmd, out: &syncbuf.Buffer{}, moving: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = r.out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		moving := regexp.MustCompile(`^step +[1-9]`)
		seen := false
		for sc.Scan() {
			fmt.Fprintln(r.out, sc.Text())
			if !seen && moving.MatchString(sc.Text()) {
				seen = true
				close(r.moving)
			}
		}
		r.err = cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-r.done
	})
	return r
}

// waitTraining waits until the run has trained a step.
func (r *liveRun) waitTraining(within time.Duration) {
	r.t.Helper()
	select {
	case <-r.moving:
	case <-r.done:
		r.t.Fatalf("pstrain run ended before training: %v\n%s", r.err, r.out)
	case <-time.After(within):
		r.t.Fatalf("no training within %v:\n%s", within, r.out)
	}
}

// wait waits for the run to exit and returns its error.
func (r *liveRun) wait(within time.Duration) error {
	r.t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(within):
		r.t.Fatalf("pstrain run still running after %v:\n%s", within, r.out)
	}
	return nil
}

// finish waits for a successful end and returns the report.
func (r *liveRun) finish(within time.Duration) *report.Report {
	r.t.Helper()
	if err := r.wait(within); err != nil {
		r.t.Fatalf("pstrain run: %v\n%s", err, r.out)
	}
	rep, err := report.Read(filepath.Join(filepath.Dir(r.dir), "report.json"))
	if err != nil {
		r.t.Fatal(err)
	}
	return rep
}

// pid is the pid of the run's task ("ps/1", "launcher"), from its pid file.
func (r *liveRun) pid(task string) int {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.dir, "pids", strings.ReplaceAll(task, "/", "-")+".pid"))
	if err != nil {
		r.t.Fatal(err)
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.PID <= 0 {
		r.t.Fatalf("pid file of %s: %q (%v)", task, b, err)
	}
	return rec.PID
}

// psAddr is ps/i's gRPC address, from the run's cluster file.
func (r *liveRun) psAddr(i int) string {
	r.t.Helper()
	b, err := os.ReadFile(filepath.Join(r.dir, "cluster.json"))
	if err != nil {
		r.t.Fatal(err)
	}
	var spec struct {
		PS []string `json:"ps"`
	}
	if err := json.Unmarshal(b, &spec); err != nil || len(spec.PS) <= i {
		r.t.Fatalf("cluster file %s: %v", b, err)
	}
	return spec.PS[i]
}

// runClock converts a wall time to the report's clock: seconds since
// the run started.
func runClock(rep *report.Report, t time.Time) float64 {
	t0 := rep.TrainStartedUnix - rep.StartupSeconds
	return float64(t.UnixNano())/1e9 - t0
}

// restartsOf are the report's restarts of task.
func restartsOf(rep *report.Report, task string) []report.Restart {
	var out []report.Restart
	for _, r := range rep.Restarts {
		if r.Task == task {
			out = append(out, r)
		}
	}
	return out
}

// checkRestart checks the times and step of one restart entry.
func checkRestart(t *testing.T, r report.Restart) {
	t.Helper()
	if r.KilledAtSeconds <= 0 || r.BackAtSeconds == nil || *r.BackAtSeconds <= r.KilledAtSeconds || r.RestoredStep < 0 {
		t.Errorf("restart %+v (back %v): want 0 < died < back and a restored step >= 0", r, deref(r.BackAtSeconds))
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// shutdownPS sends the PS at addr the chief's Stop{shutdown: true}: how a
// PS comes to exit with status 0 in the middle of a run (an insider with
// the run's token; an outsider is refused: security_test.go).
func shutdownPS(ctx context.Context, runDir, addr string) error {
	// Stop is the chief's call: sign it as the chief, with the run's
	// token (the chief's sessions are verified statelessly).
	token, err := auth.ReadTokenFile(filepath.Join(runDir, auth.TokenFile))
	if err != nil {
		return err
	}
	asChief := &auth.Client{Keys: auth.NewKeyring(token), Role: auth.RoleChief}
	asChief.SetSession(1)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(asChief.Unary()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pb.NewParameterServerClient(conn).Stop(ctx, &pb.StopRequest{Shutdown: true})
	return err
}

// A frozen PS (SIGSTOP) is killed once it has answered nothing for
// --task-timeout and recovered like a killed one: the run trains every
// step, the report says unresponsive, and the stall is bounded.
func TestFrozenPSIsKilledAndRecovered(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	testbin.MNIST(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const timeout = 3 * time.Second
	dir := t.TempDir()
	run := startRun(t, ctx, dir, "--epochs", "2", "--task-timeout", timeout.String())
	run.waitTraining(time.Minute)
	// While the run goes on, the targets file lists every task.
	if b, err := os.ReadFile(filepath.Join(dir, "targets", "pstrain.json")); err != nil || strings.Count(string(b), `"task"`) != 5 {
		t.Errorf("targets during the run: %s (%v), want 5 tasks", b, err)
	}
	pid := run.pid("ps/1")
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	rep := run.finish(2 * time.Minute)
	rs := restartsOf(rep, "ps/1")
	if len(rs) != 1 || rs[0].Cause != "unresponsive" || len(rep.Restarts) != 1 {
		// Another task killed as unresponsive would be a false kill: the
		// other four run on, loaded, on 2 cores.
		t.Fatalf("restarts %+v, want exactly one, of ps/1 with cause unresponsive\n%s", rep.Restarts, run.out)
	}
	checkRestart(t, rs[0])
	at := runClock(rep, stopped)
	// The last answer can precede the SIGSTOP by a probe interval
	// (timeout/5); the kill follows the timeout within a probe or two.
	if d := rs[0].KilledAtSeconds - at; d < timeout.Seconds()-0.7 || d > timeout.Seconds()+3 {
		t.Errorf("frozen at %.2f s, killed at %.2f s: %.2f s later, want about --task-timeout %v", at, rs[0].KilledAtSeconds, d, timeout)
	}
	if stall := *rs[0].BackAtSeconds - at; stall > timeout.Seconds()+20 {
		t.Errorf("frozen at %.2f s, back in training at %.2f s: a stall of %.1f s", at, *rs[0].BackAtSeconds, stall)
	}
	// 2 epochs of 60000 at 2 x 128 per step.
	if rep.StoppedBy != "epochs" || rep.GlobalSteps != 469 {
		t.Errorf("stopped by %s after %d steps, want all 469", rep.StoppedBy, rep.GlobalSteps)
	}
	if !strings.Contains(run.out.String(), "restart: ps/1      died at") || !strings.Contains(run.out.String(), "(unresponsive)") {
		t.Errorf("the summary does not show the restart and its cause:\n%s", run.out)
	}
	if _, err := os.Stat(filepath.Join(dir, "run", "pids", "ps-1.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file left after the run: %v", err)
	}
	t.Logf("frozen at %.2f s, killed at %.2f s, back at %.2f s, restored step %d", at, rs[0].KilledAtSeconds, *rs[0].BackAtSeconds, rs[0].RestoredStep)
}

// A PS that exits with status 0 while the run goes on (told to shut down
// by someone other than the chief at the end) is restarted and restored.
func TestPSExitingZeroIsRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	testbin.MNIST(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := startRun(t, ctx, t.TempDir(), "--epochs", "2", "--task-timeout", "2s")
	run.waitTraining(time.Minute)
	if err := shutdownPS(ctx, run.dir, run.psAddr(0)); err != nil {
		t.Fatal(err)
	}
	rep := run.finish(2 * time.Minute)
	rs := restartsOf(rep, "ps/0")
	if len(rs) != 1 || rs[0].Cause != "exit-zero" {
		t.Fatalf("restarts %+v, want one of ps/0 with cause exit-zero\n%s", rep.Restarts, run.out)
	}
	checkRestart(t, rs[0])
	if rep.StoppedBy != "epochs" || rep.GlobalSteps != 469 {
		t.Errorf("stopped by %s after %d steps, want all 469\n%s", rep.StoppedBy, rep.GlobalSteps, run.out)
	}
	for _, r := range rep.Restarts {
		t.Logf("%s: died at %.2f s (%s), back at %.2f s, restored step %d", r.Task, r.KilledAtSeconds, r.Cause, *r.BackAtSeconds, r.RestoredStep)
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// The tasks of a launcher killed with SIGKILL die with it.
func TestKilledLauncherLeavesNoTasks(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	testbin.MNIST(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := startRun(t, ctx, t.TempDir(), "--epochs", "20")
	run.waitTraining(time.Minute)
	tasks := []string{"chief", "ps/0", "ps/1", "worker/0", "worker/1"}
	pids := map[string]int{}
	for _, task := range tasks {
		pids[task] = run.pid(task)
	}
	if err := run.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	run.wait(time.Minute)
	deadline := killed.Add(5 * time.Second)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		var left []string
		for _, task := range tasks {
			if alive(pids[task]) {
				left = append(left, fmt.Sprintf("%s (pid %d)", task, pids[task]))
			}
		}
		if len(left) == 0 {
			t.Logf("every task gone %v after SIGKILL of pstrain run", time.Since(killed).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			for _, task := range tasks {
				syscall.Kill(pids[task], syscall.SIGKILL)
			}
			t.Fatalf("5 s after SIGKILL of pstrain run, still alive: %s", strings.Join(left, ", "))
		}
		<-poll.C
	}
}

// A second `pstrain run` on a run dir in use refuses to start, naming the
// processes; with --kill-stale it kills them and runs.
func TestSecondRunOnTheSameRunDir(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	testbin.MNIST(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	first := startRun(t, ctx, dir, "--epochs", "20", "--checkpoint-dir", "")
	first.waitTraining(time.Minute)
	launcher, ps0 := first.pid("launcher"), first.pid("ps/0")
	short := []string{"run", "--data-dir", testbin.MNIST(t), "--run-dir", first.dir, "--sd-dir", "", "--checkpoint-dir", "",
		"--epochs", "1", "--data-fraction", "0.1", "--target-accuracy", "0", "--eval-every", "0"}
	out, err := pstrain(t, ctx, short...)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("second run on a run dir in use: %v, want exit status 1\n%s", err, out)
	}
	for _, want := range []string{"is in use", fmt.Sprintf("launcher (pid %d)", launcher), fmt.Sprintf("ps/0 (pid %d)", ps0), "--kill-stale"} {
		if !strings.Contains(out, want) {
			t.Errorf("the error does not say %q:\n%s", want, out)
		}
	}
	if !alive(ps0) || !alive(launcher) {
		t.Fatal("the refused run touched the first run's processes")
	}
	out, err = pstrain(t, ctx, append(short, "--kill-stale")...)
	if err != nil || !strings.Contains(out, "== pstrain summary ==") {
		t.Fatalf("run with --kill-stale: %v\n%s", err, out)
	}
	if err := first.wait(time.Minute); err == nil || alive(ps0) {
		t.Errorf("the first run survived --kill-stale: exit %v, ps/0 alive %v", err, alive(ps0))
	}
}

// Two PS killed 0.3 s apart (once the first checkpoint is committed,
// however fast the machine trains): each restart has its own death
// time, on the clock of the fault log, and both are back, in order, from
// a checkpoint.
func TestOverlappingPSKills(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	testbin.MNIST(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, out := faultRun(t, ctx, t.TempDir(), "--epochs", "4", "--fault", "ps/0@checkpoint:1,ps/1@checkpoint:1+300ms")
	// The fault log's times: at=4.00s.
	logged := map[string]float64{}
	for _, m := range regexp.MustCompile(`fault: killing task with SIGKILL" task=(\S+) pid=\d+ at=([0-9.]+)s`).FindAllStringSubmatch(out, -1) {
		logged[m[1]], _ = strconv.ParseFloat(m[2], 64)
	}
	if len(rep.Restarts) != 2 {
		t.Errorf("restarts %+v, want the two PS only", rep.Restarts)
	}
	var prev float64
	for _, task := range []string{"ps/0", "ps/1"} {
		rs := restartsOf(rep, task)
		if len(rs) != 1 {
			t.Fatalf("restarts %+v, want one of %s\n%s", rep.Restarts, task, out)
		}
		r := rs[0]
		checkRestart(t, r)
		if r.RestoredStep <= 0 {
			t.Errorf("%s restored step %d, want a checkpoint's (the kills came after the first one)", task, r.RestoredStep)
		}
		at, ok := logged[task]
		// The log rounds to 2 decimals: the kill may be up to 0.005 s
		// before the logged figure.
		if !ok || r.Cause != "fault" || r.KilledAtSeconds < at-0.005 || r.KilledAtSeconds > at+0.5 {
			t.Errorf("%s: killed at %.2f s (cause %q); the fault log says at=%.2fs (logged %v)", task, r.KilledAtSeconds, r.Cause, at, ok)
		}
		// ps/1's kill is 300 ms after ps/0's: both marks are reached
		// at the same read of the chief's metrics.
		if prev > 0 && r.KilledAtSeconds < prev+0.25 {
			t.Errorf("%s died at %.2f s, not 0.3 s after the previous kill at %.2f s", task, r.KilledAtSeconds, prev)
		}
		prev = r.KilledAtSeconds
		t.Logf("%s: died at %.2f s (fault log %.2f s), back at %.2f s, restored step %d", task, r.KilledAtSeconds, at, *r.BackAtSeconds, r.RestoredStep)
	}
	// 4 epochs of 60000 at 2 x 128 per step.
	if rep.StoppedBy != "epochs" || rep.GlobalSteps != 938 {
		t.Errorf("stopped by %s after %d steps, want all 938", rep.StoppedBy, rep.GlobalSteps)
	}
}

// A timeout of 0 or less is a command-line mistake, found before
// anything starts (`--connect-timeout 0` would otherwise start the
// cluster and report a restart that "died at -1.74 s").
func TestTimeoutsMustBePositive(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"run", "--connect-timeout", "0"}, "--connect-timeout must be > 0, got 0s"},
		{[]string{"run", "--task-timeout", "0s"}, "--task-timeout must be > 0, got 0s"},
		{[]string{"run", "--task-timeout", "-1s"}, "--task-timeout must be > 0, got -1s"},
		{[]string{"ps", "--connect-timeout", "-5s"}, "--connect-timeout must be > 0, got -5s"},
		{[]string{"worker", "--connect-timeout", "0"}, "--connect-timeout must be > 0, got 0s"},
		{[]string{"ps", "--idle-timeout", "0s"}, "--idle-timeout must be > 0, got 0s"},
		{[]string{"ps", "--max-buffered-mb", "0"}, "--max-buffered-mb must be > 0, got 0"},
		{[]string{"chief", "--max-connections", "-1"}, "--max-connections must be >= 0 (0: the default), got -1"},
	} {
		err := run(context.Background(), c.args, io.Discard, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("pstrain %q: %v, want a usage error saying %q", c.args, err, c.msg)
		}
	}
}

// The summary's restart line: the cause, and no "step -1".
func TestRestartLine(t *testing.T) {
	back := 8.2
	for _, c := range []struct {
		r    report.Restart
		want string
	}{
		{report.Restart{Task: "ps/1", Cause: "unresponsive", KilledAtSeconds: 6.05, BackAtSeconds: &back, RestoredStep: 380},
			"restart: ps/1      died at 6.05 s (unresponsive), back at 8.20 s, restored step 380"},
		{report.Restart{Task: "worker/0", KilledAtSeconds: 6.05, BackAtSeconds: &back, RestoredStep: -1},
			"restart: worker/0  died at 6.05 s, back at 8.20 s, not back in training before the end"},
		{report.Restart{Task: "ps/1", Cause: "fault", KilledAtSeconds: 6.05, BackAtSeconds: &back, RestoredStep: 300, StepsLost: 80},
			"restart: ps/1      died at 6.05 s (fault), back at 8.20 s, restored step 300, 80 steps lost"},
		{report.Restart{Task: "ps/0", KilledAtSeconds: 4.01, BackAtSeconds: &back, RestoredStep: 372, TookOver: "standby/0", FailoverSeconds: 0.12},
			"restart: ps/0      died at 4.01 s, standby/0 took over in 0.12 s at step 372, 0 steps lost"},
		{report.Restart{Task: "standby/0", Cause: "fault", KilledAtSeconds: 9.5, RestoredStep: 610, StepsLost: 1, TookOver: "ps/0", FailoverSeconds: 0.2},
			"restart: standby/0 died at 9.50 s (fault), ps/0 took over in 0.20 s at step 610, 1 step lost"},
	} {
		if got := restartLine(c.r); got != c.want {
			t.Errorf("restartLine(%+v) =\n%q, want\n%q", c.r, got, c.want)
		}
	}
}
