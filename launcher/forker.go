package launcher

import (
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// forker starts processes from one goroutine locked to its OS thread for
// as long as the launcher runs.
//
// Why: a task is started with Pdeathsig (SIGKILL when its parent dies),
// and Linux counts the *thread* that forked it as the parent: when that
// thread exits, the child is killed, even though the launcher lives on
// (demonstrated: a child forked from a goroutine that locks its thread
// and returns is SIGKILLed at once). The Go runtime ends a thread when a
// goroutine locked to it returns without unlocking, so a task forked from
// an arbitrary goroutine is only as safe as every other user of
// LockOSThread in the process. Forking from a thread the launcher owns
// ties every task's life to the launcher's: the thread ends when the
// launcher process dies (SIGKILL included), or when close is called,
// after the tasks are gone.
//
// The forking thread also carries the tasks' timer slack: Linux keeps a
// thread's timer slack across fork and exec, and every thread of the
// child inherits it from the thread that made it (see TaskTimerSlack).
type forker struct {
	reqs  chan forkReq
	tid   chan int   // the forking thread's id, sent once
	slack chan error // setting the timer slack: nil, or why not; sent once
	done  chan struct{}
}

type forkReq struct {
	cmd *exec.Cmd
	err chan<- error
}

// newForker starts the forking goroutine; the processes it starts run
// with timer slack slack (0: the thread's own, the kernel's default).
// Call close once every process it started has exited.
func newForker(slack time.Duration) *forker {
	f := &forker{reqs: make(chan forkReq), tid: make(chan int, 1), slack: make(chan error, 1), done: make(chan struct{})}
	go f.loop(slack)
	return f
}

func (f *forker) loop(slack time.Duration) {
	defer close(f.done)
	// Never unlocked: no other goroutine runs on this thread, so it
	// lives exactly as long as this loop. When the loop returns the
	// runtime ends the thread (any child still alive gets its Pdeathsig).
	runtime.LockOSThread()
	f.tid <- syscall.Gettid()
	var err error
	if slack > 0 {
		err = setTimerSlack(slack)
	}
	f.slack <- err
	for r := range f.reqs {
		r.err <- r.cmd.Start()
	}
}

// start starts cmd on the forking thread (exec.Cmd.Start).
func (f *forker) start(cmd *exec.Cmd) error {
	ch := make(chan error, 1)
	f.reqs <- forkReq{cmd: cmd, err: ch}
	return <-ch
}

// close stops the forking goroutine; start must not be called after it.
func (f *forker) close() {
	close(f.reqs)
	<-f.done
}
