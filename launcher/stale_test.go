package launcher

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeProc writes /proc/PID/{cmdline,stat} under root.
func fakeProc(t *testing.T, root string, pid string, cmdline []string, startTicks string) {
	t.Helper()
	d := filepath.Join(root, pid)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	cl := ""
	for _, a := range cmdline {
		cl += a + "\x00"
	}
	// Fields 3..21 then starttime (22): a name with spaces and a ')'.
	stat := pid + " (pstrain ps) x) S" + strings.Repeat(" 0", 18) + " " + startTicks + " 0 0\n"
	if err := os.WriteFile(filepath.Join(d, "cmdline"), []byte(cl), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestProcFSAlive(t *testing.T) {
	root := t.TempDir()
	fs := procFS(root)
	args := []string{"/bin/pstrain", "ps", "--cluster=run/cluster.json", "--index=0"}
	fakeProc(t, root, "100", args, "4242")
	fakeProc(t, root, "101", nil, "4243") // a zombie: no command line
	if n, err := fs.startTicks(100); err != nil || n != 4242 {
		t.Fatalf("startTicks = %d, %v; want 4242", n, err)
	}
	for _, c := range []struct {
		name string
		r    pidRecord
		want bool
	}{
		{"same process", pidRecord{PID: 100, StartTicks: 4242, Cmdline: args}, true},
		{"start time not recorded", pidRecord{PID: 100, Cmdline: args}, true},
		{"pid reused by the same program later", pidRecord{PID: 100, StartTicks: 17, Cmdline: args}, false},
		{"pid reused by another program", pidRecord{PID: 100, StartTicks: 4242, Cmdline: []string{"/bin/pstrain", "ps", "--cluster=other/cluster.json", "--index=0"}}, false},
		{"zombie", pidRecord{PID: 101, StartTicks: 4243}, false},
		{"gone", pidRecord{PID: 102, Cmdline: args}, false},
	} {
		if got := fs.alive(c.r); got != c.want {
			t.Errorf("%s: alive = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestFindStale: live processes are reported; the pid files of dead
// ones, and unreadable ones, are removed.
func TestFindStale(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	fs := procFS(root)
	args := []string{"/bin/pstrain", "worker", "--index=1"}
	fakeProc(t, root, "200", args, "9")
	if err := writePidFile(dir, pidRecord{Task: "worker/1", PID: 200, StartTicks: 9, Cmdline: args}); err != nil {
		t.Fatal(err)
	}
	if err := writePidFile(dir, pidRecord{Task: "ps/0", PID: 201, StartTicks: 9, Cmdline: args}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "chief.pid"), []byte("garbage"), 0o644)
	live, err := findStale(dir, fs)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 1 || live[0].Task != "worker/1" || live[0].PID != 200 {
		t.Fatalf("stale %+v, want worker/1 (pid 200)", live)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	if len(left) != 1 || filepath.Base(left[0]) != "worker-1.pid" {
		t.Errorf("pid files left: %v, want only worker-1.pid", left)
	}
	msg := (&StaleError{Dir: "run", Tasks: live}).Error()
	for _, want := range []string{"run dir run is in use", "worker/1 (pid 200)", "kill -9 200", "--kill-stale"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
}

// TestClaimRunDir: a second launcher on a run dir whose launcher is
// alive (this test process) gets a StaleError; once that launcher's pid
// file is gone the dir can be claimed again.
func TestClaimRunDir(t *testing.T) {
	dir := t.TempDir()
	c := Config{Dir: dir}
	fs := procFS("/proc")
	if err := claimRunDir(context.Background(), c, dir, fs); err != nil {
		t.Fatal(err)
	}
	var se *StaleError
	if err := claimRunDir(context.Background(), c, dir, fs); !errors.As(err, &se) || len(se.Tasks) != 1 || se.Tasks[0].Task != "launcher" || se.Tasks[0].PID != os.Getpid() {
		t.Fatalf("second claim: %v, want a StaleError naming this process as the launcher", err)
	}
	os.Remove(pidFileName(dir, "launcher"))
	if err := claimRunDir(context.Background(), c, dir, fs); err != nil {
		t.Fatalf("claim after the launcher left: %v", err)
	}
}

// TestKillStale kills a real process recorded from /proc and waits for it.
func TestKillStale(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() { cmd.Wait(); close(reaped) }() // it is our child: reap it, as init would an orphan
	fs := procFS("/proc")
	r := fs.record("ps/0", cmd.Process.Pid, cmd.Args)
	// Start returns once the child has closed its exec pipe, which the
	// kernel does before the new program's argv is mapped: for a moment
	// /proc/PID/cmdline reads empty. Wait for the exec to finish.
	deadline := time.Now().Add(10 * time.Second)
	for !fs.alive(r) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if r.StartTicks == 0 || !fs.alive(r) {
		t.Fatalf("record %+v of a running process is not alive", r)
	}
	if err := killStale(context.Background(), []pidRecord{r}, fs, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if fs.alive(r) {
		t.Fatal("still alive after killStale")
	}
	<-reaped
}
