package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/internal/atomicfile"
)

// Every process of a run — the launcher and each task — leaves a pid
// file in <run-dir>/pids while it runs, removed when it exits. A launcher
// killed with SIGKILL cannot remove them; its tasks die with it
// (Pdeathsig, see forker), and the next `pstrain run` on the directory
// finds the files, sees their processes gone and removes them. If some
// process of an earlier run is still alive (another launcher still
// running, or a task that outlived its launcher), the new run refuses to
// start beside it, sharing its checkpoint directory and state file,
// unless asked to kill it (--kill-stale).

// pidRecord is the content of a pid file: enough to tell later whether
// that process is still alive and still the same program (a pid can be
// reused).
type pidRecord struct {
	Task       string   `json:"task"` // "launcher", "chief", "ps/0", ...
	PID        int      `json:"pid"`
	StartTicks uint64   `json:"start_ticks"` // field 22 of /proc/PID/stat
	Cmdline    []string `json:"cmdline"`
}

// procFS reads processes from a /proc file system mounted at root.
type procFS string

// cmdline is the process's argument list (nil for a zombie).
func (fs procFS) cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(string(fs), strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSuffix(b, []byte{0})
	if len(b) == 0 {
		return nil, nil
	}
	return strings.Split(string(b), "\x00"), nil
}

// startTicks is when the process started, in clock ticks since boot.
func (fs procFS) startTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(string(fs), strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// the fields after the last ')' start with field 3 (state).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s/%d/stat: no command name", fs, pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("%s/%d/stat: %d fields", fs, pid, len(f)+2)
	}
	return strconv.ParseUint(f[19], 10, 64) // field 22
}

// record describes the running process pid as task.
func (fs procFS) record(task string, pid int, cmdline []string) pidRecord {
	ticks, _ := fs.startTicks(pid)
	return pidRecord{Task: task, PID: pid, StartTicks: ticks, Cmdline: cmdline}
}

// alive reports whether r's process is still running the same program:
// its pid exists, is not a zombie, started at the recorded time and has
// the recorded command line.
func (fs procFS) alive(r pidRecord) bool {
	cl, err := fs.cmdline(r.PID)
	if err != nil || cl == nil || !slices.Equal(cl, r.Cmdline) {
		return false
	}
	ticks, err := fs.startTicks(r.PID)
	return err == nil && (r.StartTicks == 0 || ticks == r.StartTicks)
}

// pidFileName is the pid file of task ("ps/0" -> "ps-0.pid").
func pidFileName(dir, task string) string {
	return filepath.Join(dir, strings.ReplaceAll(task, "/", "-")+".pid")
}

func writePidFile(dir string, r pidRecord) error {
	b, _ := json.Marshal(r)
	return atomicfile.Write(pidFileName(dir, r.Task), append(b, '\n'), 0o644, atomicfile.Options{})
}

// findStale returns the processes of dir's pid files that are still
// alive, and removes the files of those that are not.
func findStale(dir string, fs procFS) ([]pidRecord, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.pid"))
	if err != nil {
		return nil, err
	}
	var live []pidRecord
	for _, p := range paths {
		var r pidRecord
		b, err := os.ReadFile(p)
		if err == nil && json.Unmarshal(b, &r) == nil && r.PID > 0 && fs.alive(r) {
			live = append(live, r)
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	return live, nil
}

// StaleError is returned by Run when processes of an earlier run on the
// same run directory are still alive.
type StaleError struct {
	Dir   string
	Tasks []pidRecord
}

func (e *StaleError) Error() string {
	var names, pids []string
	for _, r := range e.Tasks {
		names = append(names, fmt.Sprintf("%s (pid %d)", r.Task, r.PID))
		pids = append(pids, strconv.Itoa(r.PID))
	}
	return fmt.Sprintf("run dir %s is in use: processes of an earlier pstrain run are still alive: %s; stop them (kill -9 %s) or pass --kill-stale, or use another --run-dir",
		e.Dir, strings.Join(names, ", "), strings.Join(pids, " "))
}

// killStale kills the processes with SIGKILL and waits (up to wait) until
// they are gone.
func killStale(ctx context.Context, rs []pidRecord, fs procFS, wait time.Duration) error {
	for _, r := range rs {
		if err := syscall.Kill(r.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("killing %s (pid %d): %w", r.Task, r.PID, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		left := slices.DeleteFunc(slices.Clone(rs), func(r pidRecord) bool { return !fs.alive(r) })
		if len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s (pid %d) still alive %v after SIGKILL", left[0].Task, left[0].PID, wait)
		case <-tick.C:
		}
	}
}
