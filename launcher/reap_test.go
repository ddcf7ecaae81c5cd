package launcher

import (
	"testing"
	"time"
)

// Every task still running when the grace has passed is killed, not only
// the first: the deadline stays passed.
func TestReapKillsEveryTaskLeftAfterTheGrace(t *testing.T) {
	procs := []*proc{{done: make(chan struct{})}, {done: make(chan struct{})}, {done: make(chan struct{})}}
	close(procs[1].done) // this one exits by itself
	var killed []*proc
	returned := make(chan struct{})
	go func() {
		reap(procs, 10*time.Millisecond, func(p *proc) {
			killed = append(killed, p)
			close(p.done)
		})
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatalf("reap did not return: %d of the 2 hung tasks killed", len(killed))
	}
	if len(killed) != 2 || killed[0] != procs[0] || killed[1] != procs[2] {
		t.Fatalf("killed %v, want the two tasks that did not exit", killed)
	}
}

// Tasks that exit within the grace are not killed.
func TestReapWaitsForTasksThatExit(t *testing.T) {
	procs := []*proc{{done: make(chan struct{})}, {done: make(chan struct{})}}
	go func() {
		close(procs[0].done)
		close(procs[1].done)
	}()
	reap(procs, time.Minute, func(p *proc) { t.Errorf("killed a task that exited") })
}
