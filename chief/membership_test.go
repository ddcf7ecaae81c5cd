package chief

import (
	"slices"
	"testing"
	"time"
)

func TestMembershipTimesOutAndRejoins(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := NewMembership(3 * time.Second)
	m.Beat(0, t0)
	m.Beat(1, t0)
	if got := m.Live(t0.Add(3 * time.Second)); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("live at the timeout: %v", got)
	}
	m.Beat(0, t0.Add(2*time.Second))
	if got := m.Live(t0.Add(4 * time.Second)); !slices.Equal(got, []int{0}) {
		t.Fatalf("worker 1 should have timed out: %v", got)
	}
	m.Beat(1, t0.Add(5*time.Second))
	if got := m.Live(t0.Add(5 * time.Second)); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("worker 1 should be back: %v", got)
	}
}
