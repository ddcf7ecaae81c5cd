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
	// at is t0 plus q quarters of a stallBeat.
	at := func(q int) time.Time { return t0.Add(time.Duration(q) * stallBeat / 4) }
	var s stallWatch
	s.beaten(at(0))
	for _, c := range []struct {
		q     int // quarters of a stallBeat
		steps int64
		due   bool
	}{
		{4, 1, false},  // first look
		{8, 2, false},  // moving
		{12, 3, false}, //
		{16, 3, false}, // stopped one stallBeat ago
		{20, 3, true},  // stopped two ago
		{22, 3, false}, // beaten half a stallBeat ago
		{24, 3, true},
		{28, 4, false}, // moving again
		{32, 4, false},
	} {
		if got := s.due(at(c.q), c.steps); got != c.due {
			t.Fatalf("at %d quarters of a stallBeat with %d steps: due %t, want %t", c.q, c.steps, got, c.due)
		}
		if c.due {
			s.beaten(at(c.q))
		}
	}
}
