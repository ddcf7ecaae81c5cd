package task

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/gcpace"
	"github.com/pstrain/pstrain/internal/ratelog"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/dataplane"
)

// PSDeps are what a PS process takes from outside: the network, its
// TCP data plane's listener, where checkpoints go, its metrics.
type PSDeps struct {
	Network
	// DataListener is the TCP data plane's listener, bound (nil: no data
	// plane, the gRPC one), and DataAddr where workers reach it. The PS
	// closes it.
	DataListener net.Listener
	DataAddr     string
	// FS holds Run.CheckpointDir (nil: the operating system's).
	FS checkpoint.FS
	// Metrics are the shard's metrics (nil: unregistered ones).
	Metrics *metrics.PS
}

// PS is a PS process (ps/N or standby/N): a ps.Server served over gRPC
// and, on the TCP data plane, over the data plane. NewPS builds it; Serve
// serves it, Register announces it to the chief, Wait waits for the
// chief's order to exit; Close stops it.
type PS struct {
	o        Options
	lis      Network
	srv      *ps.Server
	g        *grpc.Server
	ds       *dataplane.Server // nil on the gRPC data plane
	dataAddr string
	m        *metrics.PS
	refusals *ratelog.Logger
	shutdown chan struct{} // closed when the chief orders the process to exit
	served   chan error    // the gRPC server's end
	serving  sync.WaitGroup
	closers  closers
}

// NewPS builds the PS process of o's task from its dependencies. On error
// it closes the listeners.
func NewPS(o Options, d PSDeps) (*PS, error) {
	if err := o.prepare(d.Network); err != nil {
		d.Listener.Close()
		if d.DataListener != nil {
			d.DataListener.Close()
		}
		return nil, err
	}
	m := d.Metrics
	if m == nil {
		m = metrics.NewPSWith(nil, psMetricsOptions(o.Run))
	}
	p := &PS{o: o, lis: d.Network, dataAddr: d.DataAddr, m: m, shutdown: make(chan struct{}), served: make(chan error, 1),
		refusals: ratelog.New(o.Log, refusalLogEvery, nil)}
	var once sync.Once
	p.srv = ps.NewServer(ps.Config{Log: o.Log, Metrics: m, Shutdown: func() { once.Do(func() { close(p.shutdown) }) },
		// Hot standbys (docs/replication.md): the shard this process
		// serves, and how, as a primary, it reaches its standby.
		Shard: o.Task.Index, Dial: replicaDialer(o), DataAddr: d.DataAddr, Store: o.checkpointStore(d.FS), Now: o.Now})
	maxRecv := psMaxRecv(o.Run, o.MaxMessageBytes)
	p.g = o.grpcServer(maxRecv, func(reason string) { m.RejectedRequests.WithLabelValues(reason).Inc() })
	// The data plane learns the shard's push size from its Init, or from
	// the snapshot a standby installs (ds is set before anything is
	// served).
	api := psAPI{Server: p.srv, initialised: func(req *pb.InitRequest) {
		if p.ds != nil {
			p.ds.SetPushSize(pushSize(req))
		}
	}}
	if d.DataListener != nil {
		p.ds = dataplane.NewServer(api, d.DataListener, dataplane.Config{MaxPayload: maxRecv, Limits: o.dataLimits(), Log: o.Log, Metrics: m, Auth: o.Auth, TLS: o.dataTLS()})
		// The shard's pull snapshots in the data plane's shared slots: a
		// same-host pull is answered from the snapshot, not a copy of it.
		if b := p.ds.SnapshotBuffers(); b != nil {
			p.srv.UseSnapshotBuffers(b)
		}
	}
	pb.RegisterParameterServerServer(p.g, api)
	return p, nil
}

// psMetricsOptions: async SGD has no barrier, a pull never waits for
// other workers.
func psMetricsOptions(r config.Run) metrics.PSOptions {
	return metrics.PSOptions{NoBarrier: r.Mode == config.Async}
}

// Server is the shard server.
func (p *PS) Server() *ps.Server { return p.srv }

// Serve serves the shard over gRPC, under the task's connection limit,
// and over the data plane, until Close.
func (p *PS) Serve() {
	lis := p.o.limitListener(p.lis.Listener, p.refusals, p.m.ConnectionsClosed.WithLabelValues("grpc", "limit").Inc)
	if p.ds != nil {
		p.serving.Add(1)
		go func() {
			defer p.serving.Done()
			p.ds.Serve()
		}()
		p.o.Log.Info("tcp data plane listening", "addr", p.dataAddr)
	}
	p.serving.Add(1)
	go func() {
		defer p.serving.Done()
		p.served <- p.g.Serve(lis)
	}()
	p.o.Log.Info("parameter server listening", "addr", p.lis.Addr)
}

// Register registers the PS with the chief (none without a chief in the
// cluster). The chief can restore this shard and end the run (Shutdown)
// before this PS's registration gets through, e.g. when it was restarted
// into a network that had just healed: a shutdown ends the registration
// too, and is no error (the PS exits 0 instead of retrying a chief that
// is gone until --connect-timeout; TestPartitionPS). The
// connection to the chief stays open until Close.
func (p *PS) Register(ctx context.Context) error {
	if len(p.o.Cluster.Chief) == 0 {
		return nil
	}
	conn, err := p.o.dial(p.o.Cluster.Chief[0])
	if err != nil {
		return err
	}
	p.closers.add(func() { conn.Close() })
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.shutdown:
			cancel()
		case <-ctx.Done():
		}
	}()
	if _, err := p.o.register(ctx, pb.NewChiefClient(conn), nil, p.lis.Addr); err != nil {
		select {
		case <-p.shutdown: // ended by the shutdown: the PS stops
		default:
			return err
		}
	}
	return nil
}

// Wait waits for the chief's order to exit (it then stops serving gRPC
// gracefully and returns nil), the gRPC server's failure, or the end of
// ctx.
func (p *PS) Wait(ctx context.Context) error {
	select {
	case <-p.shutdown:
		p.drain(ctx)
		p.g.GracefulStop()
		return nil
	case err := <-p.served:
		return servedErr(err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drainFor bounds how long a PS told to exit keeps answering the workers
// that have not been told training is done (ps.Server.Drained): a
// worker whose push was under way at the stop is answered done rather
// than refused, which it would retry as an outage.
const drainFor = time.Second

// drain waits until the shard has told every live worker it is done,
// for up to drainFor, or ctx ends.
func (p *PS) drain(ctx context.Context) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(drainFor)
	for !p.srv.Drained() {
		select {
		case <-tick.C:
		case <-deadline:
			p.o.Log.Info("exiting with workers not told training is done", "after", drainFor)
			return
		case <-ctx.Done():
			return
		}
	}
}

// Served waits for the gRPC server's failure or the end of ctx, serving
// on after the chief's order to exit: an in-process cluster's shards
// outlive the run for a test to read them (package testcluster).
func (p *PS) Served(ctx context.Context) error {
	select {
	case err := <-p.served:
		return servedErr(err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// servedErr is the error of a PS whose gRPC server returned err: none
// when Close stopped it.
func servedErr(err error) error {
	if err == nil || errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return fmt.Errorf("grpc server: %w", err)
}

// Close stops serving at once, as the end of the process does, and
// closes the shard server and every connection.
func (p *PS) Close() {
	if p.ds != nil {
		p.ds.Close()
	}
	p.g.Stop()
	p.serving.Wait()
	p.srv.Close()
	p.srv.ReturnSnapshotBuffers() // (the data plane's region is unmapped once they are back)
	p.refusals.Flush(true)
	p.closers.closeAll()
}

// RunPS is the PS process: it serves metrics, binds its addresses and
// serves NewPS's shard until the chief orders it to exit (nil) or ctx
// ends.
func RunPS(ctx context.Context, o Options) error {
	if err := o.prepare(Network{}); err != nil {
		return err
	}
	if o.Run.Model.IsCTR() {
		// (Keep restores the GOGC it found as the PS returns.)
		gcCtx, stopGC := context.WithCancel(ctx)
		defer stopGC()
		go gcpace.Keep(gcCtx, time.Second, psTableGCHeadroom, psGCPercent(o.Run), 100)
	} else {
		debug.SetGCPercent(psGCPercent(o.Run))
	}
	reg := o.registry()
	m := metrics.NewPSWith(reg, psMetricsOptions(o.Run))
	stopMetrics, err := o.serveMetrics(ctx, reg)
	if err != nil {
		return err
	}
	defer stopMetrics()
	lis, addr, err := o.listen()
	if err != nil {
		return err
	}
	dlis, daddr, err := o.psDataListener(addr)
	if err != nil {
		lis.Close()
		return err
	}
	p, err := NewPS(o, PSDeps{Network: Network{Listener: lis, Addr: addr}, DataListener: dlis, DataAddr: daddr, Metrics: m})
	if err != nil {
		return err
	}
	defer p.Close()
	p.Serve()
	if err := p.Register(ctx); err != nil {
		return err
	}
	return p.Wait(ctx)
}

// psGCPercent is the PS process's GOGC. A shard's live heap is a few copies of its slice (parameters,
// optimizer state, the sync accumulator, the pull snapshot, a push
// buffer per worker). On the TCP data plane it allocates almost
// nothing else per step (pull snapshots are reused, scrapes are not
// compressed), so collecting at 10% growth keeps the heap at that
// live size for free. On gRPC every pulled version costs a new copy
// and its encoding, and 10% would collect several times a step (PS
// CPU doubled, measured): 50% there, and 100% with hot standbys,
// where every replicated push and batch is a payload-sized copy too
// (at 10% the collector took two thirds of a primary's CPU). On TCP
// a primary's standby gets each push in the buffer the worker's push
// was read into, and reads it into a reused one: no copy either
// side. docs/scaling.md, "Memory"; docs/replication.md, "Cost".
//
// A shard with embedding tables is paced by bytes instead: every row
// request and answer is a protobuf message decoded into new memory,
// while its live heap grows with its tables from a few megabytes to
// hundreds. It collects after psTableGCHeadroom of garbage
// (gcpace.Keep), and never more often than psGCPercent allows.
func psGCPercent(r config.Run) int {
	switch {
	case r.DataPlane == config.GRPC && r.PSReplicas > 0:
		return 100
	case r.DataPlane == config.GRPC:
		return 50
	}
	return 10
}

// psTableGCHeadroom is the garbage a shard with embedding tables makes
// between collections (at least): what its memory goal, 1.3x its state
// + 50 MiB, leaves for garbage with a small state, with a margin
// (BENCHMARKS.md, "A CTR shard's collector paced by bytes").
const psTableGCHeadroom = 8 << 20

// psDataListener is the listener and address of the PS's TCP data plane
// (none on the gRPC data plane).
func (o Options) psDataListener(addr string) (net.Listener, string, error) {
	if o.Run.DataPlane != config.TCP {
		return nil, "", nil
	}
	return o.listenData(addr)
}

// dataTLS is the data plane's server TLS (nil without TLS): same-host
// clients authenticate with its certificate on the Unix socket.
func (o Options) dataTLS() *tls.Config {
	if o.TLS == nil {
		return nil
	}
	return dataplane.WithPrivacy(o.TLS.ServerTLS(), o.Run.DataPlanePrivacy == config.Integrity)
}

// checkpointStore is where a PS writes its shard in fs (nil: no
// checkpoints).
func (o Options) checkpointStore(fs checkpoint.FS) *checkpoint.Store {
	if o.Run.CheckpointDir == "" {
		return nil
	}
	return checkpoint.NewStore(checkpointFS(fs), o.Run.CheckpointDir, o.Run.KeepCheckpoints).WithLog(o.Log).WithMode(checkpoint.DirMode(o.Run.CheckpointMode))
}

// replicaDialer is how a primary (ps/N or standby/N: the chief decides)
// reaches the other process of its shard: a gRPC connection under the
// task's session and TLS, so the standby lets its Replicate batches in
// (transport/auth: a session of ps/N or standby/N for shard N). With
// --data-plane tcp the batches go over the standby's data plane, signed
// with the same session (docs/replication.md), and over gRPC only if the
// standby reports none.
func replicaDialer(o Options) ps.ReplicaDialer {
	return func(_ context.Context, addr string) (ps.ReplicaClient, func() error, error) {
		c, err := o.dial(addr)
		if err != nil {
			return nil, nil, err
		}
		gc := pb.NewParameterServerClient(c)
		if o.Run.DataPlane != config.TCP {
			return gc, c.Close, nil
		}
		rc := &replicaViaDataPlane{grpc: gc}
		rc.dp = o.dataPlaneClientWith(gc, rc.resolved)
		return rc, func() error {
			rc.dp.Close()
			return c.Close()
		}, nil
	}
}

// replicaViaDataPlane sends a standby its batches over the standby's
// data plane, found with its gRPC Status like a worker's; a standby that
// reports no data plane gets them over gRPC from then on.
type replicaViaDataPlane struct {
	grpc   pb.ParameterServerClient
	dp     *dataplane.Client
	noData atomic.Bool // the standby reported no data plane
}

// resolved notes the data-plane address the standby reported.
func (r *replicaViaDataPlane) resolved(addr string) { r.noData.Store(addr == "") }

func (r *replicaViaDataPlane) Replicate(ctx context.Context, in *pb.ReplicaBatch, opts ...grpc.CallOption) (*pb.ReplicaAck, error) {
	if r.noData.Load() {
		return r.grpc.Replicate(ctx, in, opts...)
	}
	ack, err := r.dp.Replicate(ctx, in)
	if err != nil && r.noData.Load() {
		return r.grpc.Replicate(ctx, in, opts...)
	}
	return ack, err
}
