package launcher

import (
	"fmt"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
)

// Parameter servers added and removed live (docs/elastic.md,
// "Parameter servers"). `pstrain scale --run-dir DIR --ps N` writes the
// request file's "ps"; the launcher starts the PS processes of the slots
// N adds (their addresses were reserved at launch: the cluster file lists
// --max-ps PS slots, and with hot standbys a standby slot beside each)
// and lets the ones it removes exit when the chief tells them to, after
// it has moved the model to the new layout.

// RequestScalePS asks the `pstrain run` on dir for ps parameter servers.
// It checks that a launcher is running there, that the run can change
// its PS count (psRefusal) and that ps is in 1..--max-ps, and returns
// the count it replaces.
func RequestScalePS(dir string, ps int) (was int, err error) {
	st, err := runScaleStatus(dir)
	if err != nil {
		return 0, err
	}
	switch {
	case st.PSRefusal != "":
		return 0, fmt.Errorf("%w: %s", ErrBadScale, st.PSRefusal)
	case ps < 1:
		return 0, fmt.Errorf("%w: --ps must be at least 1, got %d", ErrBadScale, ps)
	case ps > st.MaxPS:
		return 0, fmt.Errorf("%w: --ps %d is more than the run's --max-ps %d", ErrBadScale, ps, st.MaxPS)
	}
	return st.PS, writeScaleRequest(dir, chief.ScaleRequest{PS: ps})
}

// psRefusal says why a run of r cannot change its PS count ("": it
// can), as the chief would refuse it (chief.Core.ScalePS), so that
// `pstrain scale` refuses before the launcher starts a process.
func psRefusal(r config.Run) string {
	if r.CheckpointDir == "" {
		return "moving the model to other parameter servers goes through a checkpoint; the run has none (--checkpoint-dir)"
	}
	return ""
}

// rebalanceRefusal says why a run of r cannot be rebalanced ("": it
// can), as the chief would refuse it (chief.Core.Rebalance).
func rebalanceRefusal(r config.Run) string {
	if r.Model.IsCTR() {
		return "a ctr model's embedding rows are placed by a hash of their key, which weights do not change; change the PS count instead (--ps)"
	}
	return psRefusal(r)
}

// psScaler is the launcher's side of a change of the PS count. The
// PS processes a request removes exit when the chief tells them to,
// after it has moved the model to the new layout. A slot's processes
// are ps/N and, with hot standbys, standby/N: slotSet.running follows
// ps/N, standbys (under slotSet.mu) standby/N.
type psScaler struct {
	slotSet
	s        *supervisor
	standbys map[int]bool
	// startStandby starts standby/k (its slot claimed).
	startStandby func(k int) error
}

// startSlot starts PS slot k's processes: ps/k and, with hot standbys,
// standby/k unless its process of an earlier request still runs (it is
// restarted like any standby when it exits).
func (sc *psScaler) startSlot(g group, k int) error {
	s := sc.s
	if err := s.launch(g, s.plan.psIndex(k), cluster.Task{Type: cluster.PS, Index: k}); err != nil {
		return err
	}
	sc.ensureStandby(k)
	return nil
}

// ensureStandby starts standby/k, with hot standbys, if it has no
// process. One that cannot start is logged: its primary runs alone until
// the chief sees it.
func (sc *psScaler) ensureStandby(k int) {
	if sc.s.c.Run.PSReplicas == 0 || !sc.claimStandby(k) {
		return
	}
	if err := sc.startStandby(k); err != nil {
		sc.s.c.Log.Error("could not start a scaled task", "task", cluster.Task{Type: cluster.Standby, Index: k}.String(), "err", err)
		sc.standbyExited(k)
	}
}

// claimStandby marks standby slot k as having a process, and says
// whether it had none.
func (sc *psScaler) claimStandby(k int) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	had := sc.standbys[k]
	sc.standbys[k] = true
	return !had
}

// standbyExited notes that standby slot k's supervision ended.
func (sc *psScaler) standbyExited(k int) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	delete(sc.standbys, k)
}

// apply makes ps the target: it starts the PS processes below it that
// are not running.
func (sc *psScaler) apply(ps int) {
	log := sc.s.c.Log
	if ps < 1 || ps > sc.slots || sc.s.isFinished() || sc.s.stopping() {
		log.Error("scale request ignored", "ps", ps, "max_ps", sc.slots)
		return
	}
	was, start := sc.grow(ps)
	log.Info("scaling the parameter servers: the model moves once every shard is held", "from", was, "to", ps)
	sc.s.scaler.writeStatus()
	sc.startEach(start, log)
	// A standby of a slot an earlier request removed, and that exited
	// before the chief switched (so it was not restarted) while its
	// ps/k went on: this request keeps the slot, so it needs one again.
	for k := range ps {
		sc.ensureStandby(k)
	}
}

// noteRemovedPS notes the exit of a PS process a scale request removed:
// its end, whether clean or not (logged); it is not restarted.
func (s *supervisor) noteRemovedPS(p *proc) {
	if p.err != nil {
		s.c.Log.Warn("a removed parameter server did not exit cleanly", "task", p.task, "err", exitText(p))
	} else {
		s.c.Log.Info("removed parameter server exited", "task", p.task)
	}
	s.noteEnded(p, CauseRemoved)
}
