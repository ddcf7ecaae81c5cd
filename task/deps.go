package task

import (
	"context"
	"net"
	"sync"

	"github.com/pstrain/pstrain/checkpoint"
)

// Network is how a task meets the network: the listener its gRPC server
// serves on and how it dials its peers. A task process binds its address
// from the cluster file and dials over TCP (RunPS, RunChief, RunWorker);
// the in-process cluster (package testcluster) passes in-memory
// listeners and a dialer that reaches them. Everything else a role does
// with the network is the same in both.
type Network struct {
	// Listener is the task's gRPC listener, already bound (a worker
	// serves nothing and has none). The task closes it.
	Listener net.Listener
	// Addr is the address its peers reach Listener at: what the task
	// registers with the chief and logs.
	Addr string
	// Dialer, if set, opens every gRPC connection the task makes to a
	// peer's address (nil: TCP to the address, through gRPC's resolver).
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// Builds, if set, is held while a role builds a net (the chief's
// evaluator, a worker's net): the net library's graph construction is
// not safe for concurrent use, which a process of one task never does
// and an in-process cluster of several would.
type Builds = sync.Locker

// build calls f under mu (if set).
func build[T any](mu sync.Locker, f func() (T, error)) (T, error) {
	if mu != nil {
		mu.Lock()
		defer mu.Unlock()
	}
	return f()
}

// checkpointFS is fs, or the operating system's filesystem when nil.
func checkpointFS(fs checkpoint.FS) checkpoint.FS {
	if fs == nil {
		return checkpoint.OSFS{}
	}
	return fs
}

// closers closes what a role opened, last first.
type closers []func()

func (c *closers) add(f func()) { *c = append(*c, f) }

func (c *closers) closeAll() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}
