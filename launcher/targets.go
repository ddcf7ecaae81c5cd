package launcher

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/atomicfile"
)

// targets keeps the Prometheus file_sd file of a run (<SDDir>/pstrain.json)
// true: it lists the tasks that are alive or being restarted, drops a
// task that ended for good, and is emptied when the run ends, so that
// Prometheus and `pstrain top` never show the tasks of a finished run.
type targets struct {
	dir   string // "" = no file
	tasks []cluster.Task
	addr  func(int) string

	mu   sync.Mutex
	live []bool
}

func newTargets(dir string, tasks []cluster.Task, addr func(int) string) *targets {
	return &targets{dir: dir, tasks: tasks, addr: addr, live: make([]bool, len(tasks))}
}

// set marks task i live or gone and rewrites the file.
func (t *targets) set(i int, live bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.live[i] = live
	return t.write()
}

// setAll marks every task live or gone and rewrites the file.
func (t *targets) setAll(live bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.live {
		t.live[i] = live
	}
	return t.write()
}

// write writes the file atomically; t.mu is held.
func (t *targets) write() error {
	if t.dir == "" {
		return nil
	}
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	gs := []group{}
	for i, tk := range t.tasks {
		if t.live[i] {
			gs = append(gs, group{Targets: []string{t.addr(i)}, Labels: map[string]string{"role": tk.Type, "task": tk.String()}})
		}
	}
	b, _ := json.MarshalIndent(gs, "", "  ")
	if err := os.MkdirAll(t.dir, 0o755); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(t.dir, "pstrain.json"), append(b, '\n'), 0o644, atomicfile.Options{})
}
