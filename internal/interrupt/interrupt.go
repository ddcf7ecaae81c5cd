// Package interrupt tells one interruption from two. A process can receive
// the same request to stop more than once: coreutils `timeout`, and
// supervisors that do the same, send the signal to the process and to its
// process group, so a process in that group gets it twice within
// microseconds; a person may press Ctrl-C twice in a row. Window decides,
// from a signal and the time it arrived, whether it asks for a clean stop
// (the first), is the same request again, or is a deliberate second
// Ctrl-C that asks to stop at once.
//
// Window is a plain value driven by method calls with the time passed in:
// it reads no clock and touches no signal, so tests drive it with any
// times they like. cmd/pstrain feeds it the signals os/signal delivers.
package interrupt

import (
	"syscall"
	"time"
)

// SameEvent is how long after the first signal another one is the same
// interruption (pstrain's contract: 1 s).
const SameEvent = time.Second

// Verdict is what a signal asks for.
type Verdict int

const (
	// Stop is the first signal: stop cleanly (a final checkpoint, the
	// report).
	Stop Verdict = iota + 1
	// Same is the first request again: a signal within the window of
	// the first, or a SIGTERM at any time (a supervisor that repeats
	// itself escalates with SIGKILL, not with a second SIGTERM). Nothing
	// more to do.
	Same
	// Abort is a deliberate second interruption: a SIGINT more than the
	// window after the first signal. Stop at once.
	Abort
)

func (v Verdict) String() string {
	switch v {
	case Stop:
		return "stop"
	case Same:
		return "same"
	case Abort:
		return "abort"
	}
	return "unknown"
}

// Window classifies the signals of one process. The zero value has seen
// no signal and uses SameEvent; set Within for another window.
type Window struct {
	// Within is the window after the first signal (0 means SameEvent).
	Within time.Duration

	first   time.Time // when the first signal arrived
	started bool      // a first signal was seen
	aborted bool      // Abort was returned
}

// Signal returns what sig, arriving at now, asks for. Times come from the
// caller's clock and should not go backwards; a time before the first
// signal's counts as within the window. After Abort every further signal
// is Same: the abort is under way.
func (w *Window) Signal(sig syscall.Signal, now time.Time) Verdict {
	switch {
	case !w.started:
		w.started, w.first = true, now
		return Stop
	case w.aborted, sig != syscall.SIGINT, now.Sub(w.first) <= w.within():
		return Same
	}
	w.aborted = true
	return Abort
}

func (w *Window) within() time.Duration {
	if w.Within > 0 {
		return w.Within
	}
	return SameEvent
}
