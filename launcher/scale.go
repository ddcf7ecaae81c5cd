package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/internal/atomicfile"
)

// Elastic workers (docs/elastic.md). `pstrain scale --run-dir DIR
// --workers N` writes DIR/scale-request.json (RequestScale); the launcher
// of the run on DIR watches it and starts the workers N adds or lets the
// ones it removes exit, and the chief (--scale-file, the same file)
// changes the run's worker count at the next epoch boundary. No port is
// opened for it: whoever may write the run directory may scale the run.
const (
	// ScaleRequestFile is the request, in the run directory.
	ScaleRequestFile = "scale-request.json"
	// ScaleStatusFile says what a request may ask: the run's mode, its
	// --max-workers and the worker count last asked for.
	ScaleStatusFile = "scale-status.json"
)

// ScaleStatus is the content of ScaleStatusFile.
type ScaleStatus struct {
	RunID      string `json:"run_id"`
	Mode       string `json:"mode"`
	MaxWorkers int    `json:"max_workers"`
	Workers    int    `json:"workers"`
	// The parameter servers (psscale.go): --max-ps, the count last
	// asked for, and --ps-replicas (hot standbys: a standby per PS slot).
	MaxPS      int `json:"max_ps,omitempty"`
	PS         int `json:"ps,omitempty"`
	PSReplicas int `json:"ps_replicas,omitempty"`
	// PSRefusal says why the run cannot change its PS count ("": it
	// can; psRefusal).
	PSRefusal string `json:"ps_refusal,omitempty"`
	// Rebalance is the answer to the last rebalance request
	// (rebalance.go).
	Rebalance *RebalanceAnswer `json:"rebalance,omitempty"`
}

// Errors of a refused RequestScale.
var (
	ErrNoRun    = errors.New("no run")
	ErrBadScale = errors.New("cannot scale")
)

// RequestScale asks the `pstrain run` on dir for workers workers. It
// checks that a launcher is running there and that workers is in
// 1..--max-workers, and returns the count it replaces.
func RequestScale(dir string, workers int) (was int, err error) {
	st, err := runScaleStatus(dir)
	if err != nil {
		return 0, err
	}
	switch {
	case workers < 1:
		return 0, fmt.Errorf("%w: --workers must be at least 1, got %d", ErrBadScale, workers)
	case workers > st.MaxWorkers:
		return 0, fmt.Errorf("%w: --workers %d is more than the run's --max-workers %d", ErrBadScale, workers, st.MaxWorkers)
	}
	return st.Workers, writeScaleRequest(dir, chief.ScaleRequest{Workers: workers})
}

// runScaleStatus is the scale status of the run on dir, whose launcher
// must be alive (ErrNoRun otherwise).
func runScaleStatus(dir string) (ScaleStatus, error) {
	if !launcherAlive(dir, procFS("/proc")) {
		return ScaleStatus{}, fmt.Errorf("%w in %s: no pstrain run is running there (%s has no live launcher)", ErrNoRun, dir, filepath.Join(dir, "pids"))
	}
	st, err := readScaleStatus(dir)
	if err != nil {
		return ScaleStatus{}, fmt.Errorf("%w in %s: %v (a pstrain run older than elastic workers?)", ErrNoRun, dir, err)
	}
	return st, nil
}

// writeScaleRequest writes req as dir's next request (its Seq one past
// the last one's).
func writeScaleRequest(dir string, req chief.ScaleRequest) error {
	_, err := writeScaleRequestSeq(dir, req)
	return err
}

// writeScaleRequestSeq is writeScaleRequest, returning the Seq written.
// Requests written at once (two `pstrain scale` commands, or one and
// the launcher writing a rebalance's weights) take turns on a lock file
// beside the request, so each gets a Seq of its own: the chief reads a
// request whose Seq it has seen as no request.
func writeScaleRequestSeq(dir string, req chief.ScaleRequest) (int64, error) {
	path := filepath.Join(dir, ScaleRequestFile)
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return 0, err
	}
	defer lock.Close() // (releases the lock)
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("locking %s: %w", lock.Name(), err)
	}
	prev, _ := chief.ReadScaleRequest(path)
	req.Seq = prev.Seq + 1
	return req.Seq, writeJSON(path, req)
}

func launcherAlive(dir string, fs procFS) bool {
	b, err := os.ReadFile(pidFileName(filepath.Join(dir, "pids"), "launcher"))
	var r pidRecord
	return err == nil && json.Unmarshal(b, &r) == nil && fs.alive(r)
}

func readScaleStatus(dir string) (ScaleStatus, error) {
	var st ScaleStatus
	b, err := os.ReadFile(filepath.Join(dir, ScaleStatusFile))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	return st, err
}

// writeJSON writes v to path atomically.
func writeJSON(path string, v any) error {
	b, _ := json.MarshalIndent(v, "", "  ")
	return atomicfile.Write(path, append(b, '\n'), 0o644, atomicfile.Options{ExactMode: true})
}

// slotSet is one role's elastic count in the launcher (workers, or
// parameter servers): the count last asked for, and which of the role's
// slots have a process it supervises (their addresses were reserved at
// launch). The processes a request removes exit when the chief tells
// them to; retiring says their exit is no failure.
type slotSet struct {
	role  string                     // cluster.Worker or cluster.PS
	start func(t cluster.Task) error // starts and supervises a process of the role
	slots int

	mu      sync.Mutex
	target  int
	running map[int]bool
}

// retiring says the process of slot index was removed by a scale
// request: its exit ends it.
func (sc *slotSet) retiring(index int) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return index >= sc.target
}

// exited notes that slot index's supervision ended.
func (sc *slotSet) exited(index int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	delete(sc.running, index)
}

// count is the count last asked for.
func (sc *slotSet) count() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.target
}

// grow makes n the target and marks the slots below it that have no
// process as started, returning them and the target n replaced.
func (sc *slotSet) grow(n int) (was int, start []int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	was, sc.target = sc.target, n
	for i := range n {
		if !sc.running[i] {
			sc.running[i] = true
			start = append(start, i)
		}
	}
	return was, start
}

// startEach starts the processes of the slots grow returned; one that
// cannot start is logged and its slot left without a process.
func (sc *slotSet) startEach(start []int, log interface{ Error(string, ...any) }) {
	for _, i := range start {
		t := cluster.Task{Type: sc.role, Index: i}
		if err := sc.start(t); err != nil {
			log.Error("could not start a scaled task", "task", t.String(), "err", err)
			sc.exited(i)
		}
	}
}

// scaler is the launcher's side of elastic workers, and the watch of the
// request file for both roles.
type scaler struct {
	slotSet
	s *supervisor

	pollMu sync.Mutex
	path   string // the request file ("": not watched yet)
	seq    int64  // the last request applied
	// answer is the answer to the last rebalance request (under mu).
	answer *RebalanceAnswer
}

// watch polls the request file until ctx ends.
func (sc *scaler) watch(ctx context.Context, dir string, every time.Duration) {
	sc.pollMu.Lock()
	sc.path = filepath.Join(dir, ScaleRequestFile)
	if r, err := chief.ReadScaleRequest(sc.path); err == nil {
		sc.seq = r.Seq // a request of an earlier run on dir is not this run's
	}
	sc.pollMu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sc.poll()
	}
}

// poll applies the request file's request if it is new. The chief
// reads the file too, and may act on it first: a worker it removed may
// exit before the next tick, so judging an exit polls first
// (supervisor.removed).
func (sc *scaler) poll() {
	sc.pollMu.Lock()
	defer sc.pollMu.Unlock()
	if sc.path == "" {
		return
	}
	r, err := chief.ReadScaleRequest(sc.path)
	if err != nil || r.Seq == sc.seq {
		return
	}
	sc.seq = r.Seq
	switch {
	case r.Rebalance:
		sc.rebalance(r.Seq) // (rebalance.go)
		return
	case len(r.PSWeights) > 0:
		return // (the chief's: a rebalance's weights)
	}
	if r.Workers > 0 || r.PS == 0 {
		sc.apply(r.Workers)
	}
	if r.PS > 0 && sc.s.psScale != nil {
		sc.s.psScale.apply(r.PS)
	}
}

// apply makes workers the target: it starts the workers below it that
// are not running.
func (sc *scaler) apply(workers int) {
	log := sc.s.c.Log
	if workers < 1 || workers > sc.slots || sc.s.isFinished() || sc.s.stopping() {
		log.Error("scale request ignored", "workers", workers, "max_workers", sc.slots)
		return
	}
	was, start := sc.grow(workers)
	log.Info("scaling the workers: the change takes effect at the next epoch boundary", "from", was, "to", workers)
	sc.writeStatus()
	sc.startEach(start, log)
}

func (sc *scaler) writeStatus() {
	sc.mu.Lock()
	st := ScaleStatus{RunID: sc.s.plan.runID, Mode: string(sc.s.c.Run.Mode), MaxWorkers: sc.slots, Workers: sc.target,
		MaxPS: sc.s.plan.psSlots, PS: sc.s.c.Run.PS, PSReplicas: sc.s.c.Run.PSReplicas, PSRefusal: psRefusal(sc.s.c.Run),
		Rebalance: sc.answer}
	sc.mu.Unlock()
	if sc.s.psScale != nil {
		st.PS = sc.s.psScale.count()
	}
	if err := writeJSON(filepath.Join(sc.s.c.Dir, ScaleStatusFile), st); err != nil {
		sc.s.c.Log.Warn("could not write the scale status", "err", err)
	}
}
