package worker

import (
	"testing"
	"time"
)

// TestStallWatch: an extra heartbeat is due once the steps have stopped
// for two stallBeats, then at most every stallBeat; never while steps
// move.
func TestStallWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var s stallWatch
	s.beaten(at(0))
	for _, c := range []struct {
		ms    int
		steps int64
		due   bool
	}{
		{50, 1, false},  // first look
		{100, 2, false}, // moving
		{150, 3, false},
		{200, 3, false}, // stopped 50 ms ago
		{250, 3, true},  // stopped 100 ms ago
		{280, 3, false}, // beaten 30 ms ago
		{300, 3, true},
		{350, 4, false}, // moving again
		{400, 4, false},
	} {
		if got := s.due(at(c.ms), c.steps); got != c.due {
			t.Fatalf("at %d ms with %d steps: due %t, want %t", c.ms, c.steps, got, c.due)
		}
		if c.due {
			s.beaten(at(c.ms))
		}
	}
}
