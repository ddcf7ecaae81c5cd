package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/task"
	"github.com/pstrain/pstrain/transport/auth"
)

// PS is one shard's slot: the shard server serving now (none while it
// is killed) at a fixed address.
type PS struct {
	c      *Cluster
	index  int
	m      *metrics.PS
	client pb.ParameterServerClient // the cluster's own, set at Start

	mu     sync.Mutex
	addr   string
	inc    *psProcess // nil while killed
	starts int
}

// psProcess is one incarnation of a shard: a PS process (task.PS).
type psProcess struct {
	t      *task.PS
	cancel context.CancelFunc // ends its Served
	done   chan struct{}      // closed when its Served has returned
}

// Index is the shard's index.
func (p *PS) Index() int { return p.index }

// Addr is the shard's gRPC address (a bufconn name, or 127.0.0.1:port).
func (p *PS) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Server is the shard server serving now (nil while killed), for tests
// to look at directly (Status, Snapshot).
func (p *PS) Server() *ps.Server {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inc == nil {
		return nil
	}
	return p.inc.t.Server()
}

// Client is a gRPC client of the shard's control plane, the cluster's
// own, signed as the chief; it reconnects to a restarted shard.
func (p *PS) Client() pb.ParameterServerClient { return p.client }

// ClientAs is a gRPC client of the shard signed as worker (with a session
// of its own), for reading what the shard keeps per worker.
func (p *PS) ClientAs(worker int) (pb.ParameterServerClient, error) {
	who, err := p.c.session(auth.RoleWorker, worker)
	if err != nil {
		return nil, err
	}
	conn, err := p.c.dial(p.Addr(), who)
	if err != nil {
		return nil, err
	}
	p.c.own(conn)
	return pb.NewParameterServerClient(conn), nil
}

// Starts counts the shard's incarnations (1 after Start, 2 after one
// Restart, ...).
func (p *PS) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Status is the serving shard's status, asked in-process (an error while
// the shard is killed).
func (p *PS) Status() (*pb.StatusResponse, error) {
	srv := p.Server()
	if srv == nil {
		return nil, fmt.Errorf("testcluster: ps/%d is down", p.index)
	}
	return srv.Status(context.Background(), &pb.StatusRequest{})
}

// Kill stops the shard's servers at once, as kill -9 does to its process:
// open connections break and new ones are refused until Start. It waits
// for the serving goroutines. Killing a killed shard does nothing.
func (p *PS) Kill() {
	p.mu.Lock()
	inc := p.inc
	p.inc = nil
	addr := p.addr
	p.mu.Unlock()
	if inc == nil {
		return
	}
	p.c.publish(addr, nil)
	inc.cancel()
	inc.t.Close()
	<-inc.done
}

// Start serves a fresh, uninitialised shard at the shard's address, like
// a restarted PS process, and registers it with the chief if there is
// one. The shard must be killed.
func (p *PS) Start() error {
	if err := p.serve(); err != nil {
		return err
	}
	if p.c.chief != nil {
		return p.c.registerPS(p.c.ctx, p)
	}
	return nil
}

// Restart is Kill and Start.
func (p *PS) Restart() error {
	p.Kill()
	return p.Start()
}

// serve starts an incarnation: task.NewPS on the shard's listeners,
// served until Kill. Unlike a PS process it serves on after the chief's
// order to exit, so a test can read the shard once the run is over.
func (p *PS) serve() error {
	c := p.c
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.ctx.Err() != nil {
		return errors.New("testcluster: the cluster is closed")
	}
	if p.inc != nil {
		return fmt.Errorf("testcluster: ps/%d is running; kill it first", p.index)
	}
	tk := cluster.Task{Type: cluster.PS, Index: p.index}
	lis, addr, err := c.listen(p.addr)
	if err != nil {
		return err
	}
	c.setPSAddr(p.index, addr)
	d := task.PSDeps{Network: c.network(lis, addr), Metrics: p.m, FS: c.fs}
	if c.cfg.Run.DataPlane == config.TCP {
		if d.DataListener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			lis.Close()
			return fmt.Errorf("testcluster: %s data plane: %w", tk, err)
		}
		d.DataAddr = d.DataListener.Addr().String()
	}
	t, err := task.NewPS(c.options(tk, registerPatience), d)
	if err != nil {
		return err
	}
	t.Serve()
	ctx, cancel := context.WithCancel(c.ctx)
	inc := &psProcess{t: t, cancel: cancel, done: make(chan struct{})}
	c.goroutine(func() {
		defer close(inc.done)
		if err := t.Served(ctx); err != nil && ctx.Err() == nil {
			c.record(tk.String(), err)
		}
	})
	p.addr, p.inc = addr, inc
	p.starts++
	c.publish(addr, lis)
	return nil
}

// registerPS registers shard p with the chief, as a PS process does once
// it serves.
func (c *Cluster) registerPS(ctx context.Context, p *PS) error {
	p.mu.Lock()
	inc := p.inc
	p.mu.Unlock()
	if inc == nil {
		return fmt.Errorf("testcluster: ps/%d is down", p.index)
	}
	return inc.t.Register(ctx)
}
