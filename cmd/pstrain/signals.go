package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pstrain/pstrain/internal/interrupt"
)

// errInterrupted is returned by a command that stopped cleanly on SIGINT
// or SIGTERM: main exits with 130 or 143 and no error message.
var errInterrupted = errors.New("interrupted")

// abortGrace is how long a command that claimed the abort (see
// claimAbort) has to kill its tasks and return before the process exits
// anyway.
const abortGrace = 10 * time.Second

// signals is the process's answer to SIGINT and SIGTERM, as
// interrupt.Window classifies them. The first signal cancels the
// context: commands stop cleanly (`pstrain run` and the chief write a
// final checkpoint and the report). Signals within interrupt.SameEvent
// of the first (the same signal delivered to the process and to its
// process group, as coreutils `timeout` sends it), and any later
// SIGTERM, are that same interruption. A later SIGINT (a deliberate
// second Ctrl-C) stops at once: abort is closed, and the process exits
// unless a command that must clean up (`pstrain run`, whose tasks run in
// their own process groups) has claimed it.
type signals struct {
	mu      sync.Mutex
	first   os.Signal
	abort   chan struct{}
	claimed bool
}

// signalDeps are what the signal watcher uses from the outside: the
// clock it times signals with, how it ends the process, and where it
// says that a signal was taken as the same interruption.
type signalDeps struct {
	now    func() time.Time
	exit   func(code int)
	stderr io.Writer
}

// watchSignals watches SIGINT and SIGTERM for the whole process.
func watchSignals() (context.Context, *signals) {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	return newSignals(context.Background(), ch, signalDeps{now: time.Now, exit: os.Exit, stderr: os.Stderr})
}

// newSignals answers the signals received on ch until ch is closed.
func newSignals(parent context.Context, ch <-chan os.Signal, d signalDeps) (context.Context, *signals) {
	ctx, cancel := context.WithCancelCause(parent)
	s := &signals{abort: make(chan struct{})}
	go s.watch(ch, cancel, d)
	return context.WithValue(ctx, signalsKey{}, s), s
}

func (s *signals) watch(ch <-chan os.Signal, cancel context.CancelCauseFunc, d signalDeps) {
	var w interrupt.Window
	var first time.Time
	for sig := range ch {
		n, _ := sig.(syscall.Signal)
		now := d.now()
		switch w.Signal(n, now) {
		case interrupt.Stop:
			s.mu.Lock()
			s.first = sig
			s.mu.Unlock()
			first = now
			cancel(fmt.Errorf("%v", sig))
		case interrupt.Same:
			fmt.Fprintf(d.stderr, "pstrain: %s again, %s after the first signal: the same interruption (Ctrl-C a second or more after the first stops at once)\n",
				unix.SignalName(n), now.Sub(first).Round(time.Microsecond))
		case interrupt.Abort:
			s.mu.Lock()
			claimed := s.claimed
			s.mu.Unlock()
			close(s.abort)
			if !claimed {
				d.exit(s.exitCode())
				return
			}
			// The claimant kills its tasks and returns; if it cannot, exit.
			time.AfterFunc(abortGrace, func() { d.exit(s.exitCode()) })
		}
	}
}

type signalsKey struct{}

// claimAbort returns the channel closed by a deliberate second Ctrl-C and
// stops that signal from exiting the process: the caller must then stop
// promptly by itself. Nil when main did not set signals up (tests).
func claimAbort(ctx context.Context) <-chan struct{} {
	s, _ := ctx.Value(signalsKey{}).(*signals)
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claimed = true
	return s.abort
}

func (s *signals) received() os.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first
}

// exitCode is 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM.
func (s *signals) exitCode() int {
	if n, ok := s.received().(syscall.Signal); ok {
		return 128 + int(n)
	}
	return 1
}
