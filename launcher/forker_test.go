package launcher

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestForkerForksOnItsThread: processes started through the forker from
// any goroutine are children of the forker's thread, the one thread
// whose life Pdeathsig follows (/proc/self/task/TID/children lists a
// thread's children).
func TestForkerForksOnItsThread(t *testing.T) {
	f := newForker(0)
	defer f.close()
	var wg sync.WaitGroup
	cmds := make([]*exec.Cmd, 3)
	for i := range cmds {
		cmds[i] = exec.Command("sleep", "60")
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.start(cmds[i]); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, c := range cmds {
			if c.Process != nil {
				c.Process.Kill()
				c.Wait()
			}
		}
	}()
	if t.Failed() {
		return
	}
	tid := <-f.tid
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/children", tid))
	if err != nil {
		t.Skipf("no /proc/PID/task/TID/children here: %v", err)
	}
	children := strings.Fields(string(b))
	for _, c := range cmds {
		if !slices.Contains(children, strconv.Itoa(c.Process.Pid)) {
			t.Errorf("pid %d is not a child of the forker's thread %d (its children: %v)", c.Process.Pid, tid, children)
		}
	}
}

// The processes the forker starts run with its timer slack (Linux keeps
// it across fork and exec); without one, with the launcher's own.
func TestForkerGivesItsTimerSlack(t *testing.T) {
	own, err := timerSlack()
	if err != nil {
		t.Skipf("no timer slack here: %v", err)
	}
	for _, slack := range []time.Duration{3 * time.Millisecond, 0} {
		f := newForker(slack)
		if err := <-f.slack; err != nil {
			t.Fatalf("setting the slack %v: %v", slack, err)
		}
		cmd := exec.Command("sleep", "60")
		if err := f.start(cmd); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", cmd.Process.Pid))
		cmd.Process.Kill()
		cmd.Wait()
		f.close()
		if err != nil {
			t.Skipf("cannot read a child's timer slack here: %v", err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		want := slack
		if slack == 0 {
			want = own
		}
		if got := time.Duration(ns); got != want {
			t.Errorf("forker with slack %v: the child's timer slack is %v, want %v", slack, got, want)
		}
	}
}
