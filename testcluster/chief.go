package testcluster

import (
	"context"
	"fmt"
	"time"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/task"
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

// Chief is the cluster's chief: a chief task (task.Chief) served, its Run
// in a goroutine.
type Chief struct {
	c      *Cluster
	t      *task.Chief
	cancel context.CancelFunc
	ctx    context.Context
	done   chan struct{} // closed when Run has returned
	ran    bool

	// Set before done is closed.
	rep *report.Report
	err error
}

// startChief builds the chief with task.NewChief on the cluster's chief
// listener and serves it; run starts its Run.
func (c *Cluster) startChief(cc ChiefConfig) (*Chief, error) {
	ch := &Chief{c: c, done: make(chan struct{})}
	ch.ctx, ch.cancel = context.WithCancel(c.ctx)
	if cc.StartupTimeout <= 0 {
		cc.StartupTimeout = 30 * time.Second
	}
	tweak := func(cfg *chief.Config) {
		cfg.PollEvery, cfg.OnProgress = cc.PollEvery, cc.OnProgress
		if cc.Tweak != nil {
			cc.Tweak(cfg)
		}
	}
	o := c.options(cluster.Task{Type: cluster.Chief}, cc.StartupTimeout)
	co := task.ChiefOptions{RunID: c.cfg.RunID, EvalBatch: cc.EvalBatch, StatePath: cc.StatePath}
	t, err := task.NewChief(o, co, task.ChiefDeps{Network: c.network(c.chiefLis, c.chiefAddr), Spec: c.cfg.Spec,
		Test: cc.Test, TrainN: c.cfg.Train.N, FS: c.fs, Metrics: cc.Metrics, Builds: &buildMu, Tweak: tweak})
	if err != nil {
		ch.cancel()
		return nil, err
	}
	ch.t = t
	t.Serve()
	c.publish(c.chiefAddr, c.chiefLis)
	return ch, nil
}

// run starts the chief task's Run: once it has a report the chief tells
// the shards to exit, as the chief process does.
func (ch *Chief) run() {
	ch.ran = true
	ch.c.goroutine(func() {
		defer close(ch.done)
		rep, err := ch.t.Run(ch.ctx)
		if err != nil && ch.ctx.Err() == nil {
			ch.c.record("chief", err)
		}
		ch.rep, ch.err = rep, err
	})
}

// close ends Run and stops serving.
func (ch *Chief) close() {
	ch.cancel()
	if ch.ran {
		<-ch.done
	}
	ch.c.publish(ch.c.chiefAddr, nil)
	ch.t.Close()
}

// Chief is the chief.Chief itself.
func (ch *Chief) Chief() *chief.Chief { return ch.t.Chief() }

// Addr is the chief's gRPC address.
func (ch *Chief) Addr() string { return ch.t.Addr() }

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
