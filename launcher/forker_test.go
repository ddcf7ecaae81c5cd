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
)

// TestForkerForksOnItsThread: processes started through the forker from
// any goroutine are children of the forker's thread, the one thread
// whose life Pdeathsig follows (/proc/self/task/TID/children lists a
// thread's children).
func TestForkerForksOnItsThread(t *testing.T) {
	f := newForker()
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
