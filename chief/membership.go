package chief

import (
	"slices"
	"time"
)

// Membership tracks which workers are alive from their heartbeats. It is a
// pure type: time is passed in.
type Membership struct {
	timeout time.Duration
	last    map[int]time.Time
}

// NewMembership declares a worker dead after timeout without a heartbeat.
func NewMembership(timeout time.Duration) *Membership {
	return &Membership{timeout: timeout, last: map[int]time.Time{}}
}

// Beat records a heartbeat (or registration) from worker at now.
func (m *Membership) Beat(worker int, now time.Time) { m.last[worker] = now }

// Live returns the workers heard from within the timeout, sorted.
func (m *Membership) Live(now time.Time) []int {
	var out []int
	for w, t := range m.last {
		if now.Sub(t) <= m.timeout {
			out = append(out, w)
		}
	}
	slices.Sort(out)
	return out
}
