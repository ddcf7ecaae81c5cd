package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeClock is the signal watcher's clock in tests: it reads the time
// the test set.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// noteWriter hands each line the watcher writes to the test.
type noteWriter chan string

func (w noteWriter) Write(p []byte) (int, error) {
	w <- string(p)
	return len(p), nil
}

// signalRig is a signal watcher fed by the test, with a fake clock, an
// exit that records its code and its stderr lines on a channel. The test
// knows the watcher has handled a signal when its effect shows: the
// context ends (the first), a note arrives (the same interruption), abort
// closes or exit is called.
type signalRig struct {
	ch    chan os.Signal
	clock *fakeClock
	exits chan int
	notes noteWriter
	ctx   context.Context
	s     *signals
}

func newSignalRig(t *testing.T) *signalRig {
	r := &signalRig{ch: make(chan os.Signal), clock: &fakeClock{t: time.Unix(1e9, 0)}, exits: make(chan int, 1), notes: make(noteWriter, 8)}
	r.ctx, r.s = newSignals(context.Background(), r.ch, signalDeps{now: r.clock.now, exit: func(code int) { r.exits <- code }, stderr: r.notes})
	t.Cleanup(func() { close(r.ch) })
	return r
}

// same sends sig and wants the watcher to take it as the same
// interruption, d after the first signal.
func (r *signalRig) same(t *testing.T, sig syscall.Signal, d time.Duration) {
	t.Helper()
	r.ch <- sig
	want := fmt.Sprintf("pstrain: %s again, %v after the first signal: the same interruption", unix.SignalName(sig), d)
	if note := <-r.notes; !strings.HasPrefix(note, want) {
		t.Errorf("note %q, want %q...", note, want)
	}
	if aborted(r.s) {
		t.Fatalf("%v %v after the first signal aborted", sig, d)
	}
}

func aborted(s *signals) bool {
	select {
	case <-s.abort:
		return true
	default:
		return false
	}
}

// The first signal cancels the context; the same signal again within a
// second (timeout's delivery to the process and to its group) neither
// aborts nor exits; a Ctrl-C after that aborts.
func TestSignalsOneInterruptionIsOne(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			r := newSignalRig(t)
			abort := claimAbort(r.ctx)
			r.ch <- sig
			<-r.ctx.Done()
			if got, want := r.s.exitCode(), 128+int(sig); got != want {
				t.Errorf("exit code %d, want %d", got, want)
			}
			r.same(t, sig, 0)
			r.clock.advance(999 * time.Millisecond)
			r.same(t, sig, 999*time.Millisecond)
			r.same(t, syscall.SIGINT, 999*time.Millisecond)
			r.clock.advance(time.Second)
			r.ch <- syscall.SIGINT
			<-abort
			select {
			case code := <-r.exits:
				t.Fatalf("exited with %d although the abort was claimed", code)
			default:
			}
			if got, want := r.s.exitCode(), 128+int(sig); got != want {
				t.Errorf("after the abort: exit code %d, want the first signal's %d", got, want)
			}
		})
	}
}

// Without a claimant, a deliberate second Ctrl-C exits the process with
// the first signal's status; a repeated SIGTERM never does.
func TestSignalsSecondCtrlCExits(t *testing.T) {
	r := newSignalRig(t)
	r.ch <- syscall.SIGTERM
	<-r.ctx.Done()
	r.clock.advance(time.Minute)
	r.same(t, syscall.SIGTERM, time.Minute)
	r.ch <- syscall.SIGINT
	if code := <-r.exits; code != 143 {
		t.Errorf("exit %d, want 143 (the first signal's)", code)
	}
	if !aborted(r.s) {
		t.Error("abort not closed")
	}
}
