package interrupt

import (
	"syscall"
	"testing"
	"time"
)

// Each case is a sequence of signals at offsets from the first; want is
// the verdict of each.
func TestWindow(t *testing.T) {
	const (
		INT  = syscall.SIGINT
		TERM = syscall.SIGTERM
	)
	type sig struct {
		s    syscall.Signal
		at   time.Duration
		want Verdict
	}
	for _, c := range []struct {
		name string
		sigs []sig
	}{
		{"one Ctrl-C", []sig{{INT, 0, Stop}}},
		{"one SIGTERM", []sig{{TERM, 0, Stop}}},
		{"timeout: SIGINT to the process and its group", []sig{{INT, 0, Stop}, {INT, 3 * time.Microsecond, Same}}},
		{"timeout: SIGTERM to the process and its group", []sig{{TERM, 0, Stop}, {TERM, time.Microsecond, Same}}},
		{"Ctrl-C twice quickly is one", []sig{{INT, 0, Stop}, {INT, 400 * time.Millisecond, Same}, {INT, 999 * time.Millisecond, Same}}},
		{"the window's last instant is inside", []sig{{INT, 0, Stop}, {INT, time.Second, Same}}},
		{"a deliberate second Ctrl-C aborts", []sig{{INT, 0, Stop}, {INT, time.Second + time.Nanosecond, Abort}}},
		{"duplicates, then a later Ctrl-C", []sig{{INT, 0, Stop}, {INT, 0, Same}, {INT, 5 * time.Second, Abort}}},
		{"the window counts from the first, not the last", []sig{{INT, 0, Stop}, {INT, 900 * time.Millisecond, Same}, {INT, 1100 * time.Millisecond, Abort}}},
		{"a supervisor's repeated SIGTERM never aborts", []sig{{TERM, 0, Stop}, {TERM, 10 * time.Second, Same}, {TERM, time.Minute, Same}}},
		{"SIGINT then a later SIGTERM is the same stop", []sig{{INT, 0, Stop}, {TERM, 5 * time.Second, Same}}},
		{"SIGTERM then a later Ctrl-C aborts", []sig{{TERM, 0, Stop}, {INT, 2 * time.Second, Abort}}},
		{"after the abort, more is the same abort", []sig{{INT, 0, Stop}, {INT, 2 * time.Second, Abort}, {INT, 3 * time.Second, Same}}},
		{"a clock that steps back stays in the window", []sig{{INT, 0, Stop}, {INT, -time.Hour, Same}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			var w Window
			for i, s := range c.sigs {
				if got := w.Signal(s.s, t0.Add(s.at)); got != s.want {
					t.Errorf("signal %d (%v at +%v): %v, want %v", i, s.s, s.at, got, s.want)
				}
			}
		})
	}
}

func TestWindowWithin(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := Window{Within: 10 * time.Millisecond}
	if v := w.Signal(syscall.SIGINT, t0); v != Stop {
		t.Fatalf("first: %v", v)
	}
	if v := w.Signal(syscall.SIGINT, t0.Add(5*time.Millisecond)); v != Same {
		t.Errorf("within 10ms: %v, want same", v)
	}
	if v := w.Signal(syscall.SIGINT, t0.Add(20*time.Millisecond)); v != Abort {
		t.Errorf("after 10ms: %v, want abort", v)
	}
}
