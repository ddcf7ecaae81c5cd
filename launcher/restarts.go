package launcher

import (
	"cmp"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// Why a task's process ended before the run did: the report's
// restarts[].cause.
const (
	// CauseUnresponsive: it answered nothing for --task-timeout and the
	// launcher killed it with SIGKILL.
	CauseUnresponsive = "unresponsive"
	// CauseFault: killed by --fault.
	CauseFault = "fault"
	// CauseSignal: it died of a signal nobody in pstrain sent (kill -9,
	// the OOM killer, a crash).
	CauseSignal = "signal"
	// CauseExitNonZero: it exited with a non-zero status.
	CauseExitNonZero = "exit-nonzero"
	// CauseExitZero: it exited with status 0 while the run went on.
	CauseExitZero = "exit-zero"
	// CauseQuarantined: a worker the chief quarantined (its gradients
	// pointed away from the model's progress); not restarted.
	CauseQuarantined = "quarantined"
	// CauseRemoved: a worker removed by `pstrain scale`; not restarted.
	CauseRemoved = "removed"
	// CauseKilledAtEnd: it did not exit within 15 s of the run's end
	// (frozen, or stuck) and the launcher killed it.
	CauseKilledAtEnd = "killed-after-training"
)

// endedRecords are the report's records of processes that ended and
// were not restarted: never back (BackAtSeconds nil, RestoredStep -1).
func endedRecords(ended []restart, t0 time.Time) []report.Restart {
	out := []report.Restart{}
	for _, e := range ended {
		out = append(out, report.Restart{Task: e.task, Cause: e.cause, KilledAtSeconds: e.exitedAt.Sub(t0).Seconds(), RestoredStep: -1})
	}
	return out
}

// exitCause classifies an exit the launcher did not cause itself.
func exitCause(ps *os.ProcessState) string {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return CauseSignal
	}
	if ps.ExitCode() == 0 {
		return CauseExitZero
	}
	return CauseExitNonZero
}

// restart is one abnormal exit of a task, as the launcher saw it.
type restart struct {
	task     string
	cause    string
	exitedAt time.Time
	backAt   time.Time // when the new process started
}

// mergeRestarts combines the launcher's view of each restart (why and
// when the process died, when a new one started) with the chief's (when
// the task was back in training and from which step). Every time is in
// seconds since t0, the run's start: the clock of --fault and of the
// launcher's log. The chief counts from the first step (trainStartUnix),
// so its times are moved by the start-up time.
//
// A chief record belongs to a launcher restart of the same task when it
// falls between the new process's start and the task's next death. In
// sync mode (rollbackAll) one rollback restores every shard, and the
// chief records it under the shard that triggered it: a PS restart with
// no record of its own takes the first rollback after its new process
// started (two PS killed close together are back with the same rollback).
// A restart the chief never saw back before the run ended keeps the
// process's start as its back time and restored step -1. A hot standby's
// failover (docs/replication.md) is back when the standby took over,
// usually before the dead process is started again: its record belongs to
// the death just before it.
func mergeRestarts(chief []report.Restart, seen []restart, t0 time.Time, trainStartUnix float64, rollbackAll bool) []report.Restart {
	m := merger{recs: onRunClock(chief, t0, trainStartUnix), seen: slices.Clone(seen), t0: t0}
	slices.SortStableFunc(m.seen, func(a, b restart) int { return a.exitedAt.Compare(b.exitedAt) })
	used := make([]bool, len(m.recs))
	out := []report.Restart{}
	for i, s := range m.seen {
		j := m.match(i, used)
		if j < 0 && rollbackAll && strings.HasPrefix(s.task, "ps/") {
			j = m.earliestPSRollback(i)
		}
		out = append(out, m.record(i, j))
	}
	// Recoveries the launcher did not cause (a task restarted by hand).
	for j, r := range m.recs {
		if !used[j] {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(a, b report.Restart) int { return cmp.Compare(a.KilledAtSeconds, b.KilledAtSeconds) })
	return out
}

// onRunClock is the chief's restart records with their times moved from
// the chief's clock (seconds since training started) to the run's.
func onRunClock(chief []report.Restart, t0 time.Time, trainStartUnix float64) []report.Restart {
	off := 0.0 // the chief's clock on the run's
	if trainStartUnix > 0 {
		off = trainStartUnix - float64(t0.UnixNano())/1e9
	}
	recs := make([]report.Restart, len(chief))
	for i, r := range chief {
		recs[i] = r
		if r.KilledAtSeconds > 0 {
			recs[i].KilledAtSeconds += off
		}
		if r.BackAtSeconds != nil {
			recs[i].BackAtSeconds = ptr(*r.BackAtSeconds + off)
		}
	}
	return recs
}

// merger pairs the launcher's restarts (seen, by time of death) with the
// chief's records (recs, on the run's clock).
type merger struct {
	recs []report.Restart
	seen []restart
	t0   time.Time
}

func (m merger) rel(t time.Time) float64 { return t.Sub(m.t0).Seconds() }

// window is where restart i's chief record may fall: from its new
// process's start to the task's next death. (A failover's record may
// fall from the death itself.)
func (m merger) window(i int, failover bool) (from, to float64) {
	from, to = m.rel(m.seen[i].backAt), float64(1<<62)
	if failover {
		from = m.rel(m.seen[i].exitedAt)
	}
	for _, n := range m.seen[i+1:] {
		if n.task == m.seen[i].task {
			return from, m.rel(n.exitedAt)
		}
	}
	return from, to
}

func backIn(r report.Restart, from, to float64) bool {
	return r.BackAtSeconds != nil && *r.BackAtSeconds >= from && *r.BackAtSeconds < to
}

// match is the first unused record of restart i's task in its window
// (marked used), or -1.
func (m merger) match(i int, used []bool) int {
	for j, r := range m.recs {
		from, to := m.window(i, r.TookOver != "")
		if !used[j] && r.Task == m.seen[i].task && backIn(r, from, to) {
			used[j] = true
			return j
		}
	}
	return -1
}

// earliestPSRollback is, for a shard's restart i in a sync run (where a
// shard's restart rolls every shard back), the earliest shard rollback
// in its window, or -1.
func (m merger) earliestPSRollback(i int) int {
	j := -1
	from, to := m.window(i, false)
	for k, r := range m.recs {
		if strings.HasPrefix(r.Task, "ps/") && r.TookOver == "" && backIn(r, from, to) && (j < 0 || *r.BackAtSeconds < *m.recs[j].BackAtSeconds) {
			j = k
		}
	}
	return j
}

// record is the report's record of restart i, completed by the chief's
// record j (none when j < 0).
func (m merger) record(i, j int) report.Restart {
	s := m.seen[i]
	out := report.Restart{Task: s.task, Cause: s.cause, KilledAtSeconds: m.rel(s.exitedAt), BackAtSeconds: ptr(m.rel(s.backAt)), RestoredStep: -1}
	if j < 0 {
		return out
	}
	r := m.recs[j]
	out.BackAtSeconds, out.RestoredStep, out.StepsLost = r.BackAtSeconds, r.RestoredStep, r.StepsLost
	out.TookOver, out.FailoverSeconds = r.TookOver, r.FailoverSeconds
	if r.TookOver != "" && r.BackAtSeconds != nil {
		// From the death itself, which the launcher saw; the chief
		// counts from its next poll.
		out.FailoverSeconds = max(r.FailoverSeconds, *r.BackAtSeconds-out.KilledAtSeconds)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
