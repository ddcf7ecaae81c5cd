package testcluster

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/task"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/dataplane"
)

// ChiefConfig is the chief's part of a Config.
type ChiefConfig struct {
	// Test is the evaluation set (nil: the chief does not evaluate).
	Test *dataset.Dataset
	// EvalBatch is the evaluator's batch (default 1000, at most Test.N).
	EvalBatch int
	// PollEvery is how often the chief polls the shards (default: the
	// chief's).
	PollEvery time.Duration
	// StartupTimeout bounds the wait for every task to register (default
	// 30s).
	StartupTimeout time.Duration
	// StatePath is where the chief keeps its state ("" = nowhere).
	StatePath  string
	Metrics    *metrics.Chief
	OnProgress func(chief.Progress)
	// Tweak, if set, has the last word on the chief's configuration.
	Tweak func(*chief.Config)
}

// Chief is the cluster's chief: chief.Run in a goroutine, served as
// pb.ChiefServer.
type Chief struct {
	c      *Cluster
	chief  *chief.Chief
	ev     *chief.Evaluator // nil without a test set
	g      *grpc.Server
	client pb.ChiefClient // the cluster's own (PS registration)
	addr   string
	cancel context.CancelFunc
	ctx    context.Context
	done   chan struct{} // closed when Run has returned
	ran    bool

	// Set before done is closed.
	rep *report.Report
	err error
}

// startChief builds the chief as task.RunChief does and serves it; run
// starts its Run.
func (c *Cluster) startChief(cc ChiefConfig) (*Chief, error) {
	r := c.cfg.Run
	ch := &Chief{c: c, done: make(chan struct{})}
	ch.ctx, ch.cancel = context.WithCancel(c.ctx)
	log := c.cfg.Log.With("task", "chief")
	var pss []chief.PS
	who, err := c.session(auth.RoleChief, 0)
	if err != nil {
		return nil, err
	}
	for _, p := range c.ps {
		conn, err := c.dial(p.Addr(), who)
		if err != nil {
			return nil, err
		}
		c.own(conn)
		var client pb.ParameterServerClient = pb.NewParameterServerClient(conn)
		if r.DataPlane == config.TCP {
			// The evaluation's pulls too, like the chief process.
			dc := dataPlaneClient(client, c.cfg.MaxMessageBytes, who)
			c.own(dc)
			client = task.PullsVia(client, dc)
		}
		pss = append(pss, chief.PS{Addr: p.Addr(), Client: client})
	}
	if cc.Test != nil {
		if cc.EvalBatch <= 0 {
			cc.EvalBatch = 1000
		}
		ev, err := newNet(func() (*chief.Evaluator, error) {
			return chief.NewEvaluator(c.cfg.Spec, cc.Test, cc.EvalBatch, c.cfg.Run.Seed)
		})
		if err != nil {
			return nil, err
		}
		ch.ev = ev
	}
	if cc.StartupTimeout <= 0 {
		cc.StartupTimeout = 30 * time.Second
	}
	cfg := chief.Config{Run: r, Spec: c.cfg.Spec, RunID: c.cfg.RunID, PS: pss, TrainN: c.cfg.Train.N,
		Log: log, Metrics: cc.Metrics, PollEvery: cc.PollEvery, StartupTimeout: cc.StartupTimeout,
		StatePath: cc.StatePath, OnProgress: cc.OnProgress}
	if ch.ev != nil {
		cfg.Evaluator = ch.ev
	}
	if c.fs != nil {
		cfg.Store = c.store()
	}
	if cc.Tweak != nil {
		cc.Tweak(&cfg)
	}
	if ch.chief, err = chief.New(cfg); err != nil {
		ch.closeEvaluator()
		return nil, err
	}
	lis, addr, err := c.listen(c.newAddr("chief"))
	if err != nil {
		ch.closeEvaluator()
		return nil, err
	}
	ch.addr = addr
	ch.g = c.grpcServer(nil)
	pb.RegisterChiefServer(ch.g, ch.chief)
	c.serveGRPC("chief", ch.g, lis, nil)
	c.publish(addr, lis)
	conn, err := c.dial(addr, who)
	if err != nil {
		ch.g.Stop()
		ch.closeEvaluator()
		return nil, err
	}
	c.own(conn)
	ch.client = pb.NewChiefClient(conn)
	return ch, nil
}

// run starts chief.Run; once it returns with a report the chief tells
// the shards to exit, as the chief process does.
func (ch *Chief) run() {
	ch.ran = true
	ch.c.goroutine(func() {
		defer close(ch.done)
		defer ch.closeEvaluator()
		rep, err := ch.chief.Run(ch.ctx)
		if err == nil {
			sctx, cancel := context.WithTimeout(ch.ctx, 10*time.Second)
			ch.chief.Shutdown(sctx)
			cancel()
		} else if ch.ctx.Err() == nil {
			ch.c.record("chief", err)
		}
		ch.rep, ch.err = rep, err
	})
}

func (ch *Chief) closeEvaluator() {
	if ch.ev != nil {
		ch.ev.Close()
	}
}

// close ends Run and stops serving.
func (ch *Chief) close() {
	ch.cancel()
	if ch.ran {
		<-ch.done
	} else {
		ch.closeEvaluator()
	}
	ch.c.publish(ch.addr, nil)
	ch.g.Stop()
}

// Chief is the chief.Chief itself.
func (ch *Chief) Chief() *chief.Chief { return ch.chief }

// Addr is the chief's gRPC address.
func (ch *Chief) Addr() string { return ch.addr }

// Done is closed when the chief's Run has returned.
func (ch *Chief) Done() <-chan struct{} { return ch.done }

// Wait waits for the chief's Run and returns its report and error (or
// ctx's error, if ctx ends first).
func (ch *Chief) Wait(ctx context.Context) (*report.Report, error) {
	select {
	case <-ch.done:
		return ch.rep, ch.err
	case <-ctx.Done():
		return nil, fmt.Errorf("testcluster: waiting for the chief: %w", ctx.Err())
	}
}

// dataPlaneClient is a data-plane client of the shard gc reaches, as a
// task process makes it; requests are signed as who.
func dataPlaneClient(gc pb.ParameterServerClient, maxPayload int, who *auth.Client) *dataplane.Client {
	return task.NewDataPlaneClient(gc, task.DataPlaneDeps{MaxPayload: maxPayload, Sign: who}, nil)
}
