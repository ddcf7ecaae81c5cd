package task

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"runtime/debug"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/ratelog"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/dataplane"
)

// RunPS serves one shard until the chief orders it to exit (nil) or ctx
// ends.
func RunPS(ctx context.Context, o Options) error {
	if err := o.prepare(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	debug.SetGCPercent(psGCPercent(o.Run))
	reg := o.registry()
	// Async SGD has no barrier: a pull never waits for other workers.
	m := metrics.NewPSWith(reg, metrics.PSOptions{NoBarrier: o.Run.Mode == config.Async})
	stopMetrics, err := o.serveMetrics(ctx, reg)
	if err != nil {
		return err
	}
	defer stopMetrics()
	lis, addr, err := o.listen()
	if err != nil {
		return err
	}
	refusals := ratelog.New(o.Log, refusalLogEvery, nil)
	defer refusals.Flush(true)
	lis = o.limitListener(lis, refusals, m.ConnectionsClosed.WithLabelValues("grpc", "limit").Inc)
	shutdown := make(chan struct{})
	// The chief can restore this shard and end the run (Shutdown) before
	// this PS's registration gets through, e.g. when it was restarted into
	// a network that had just healed: a shutdown ends the registration
	// too, and the PS exits 0 instead of retrying a chief that is gone
	// until --connect-timeout (found by TestPartitionPS).
	registering, stopRegistering := context.WithCancel(ctx)
	defer stopRegistering()
	dlis, daddr, err := o.psDataListener(addr)
	if err != nil {
		return err
	}
	srv := ps.NewServer(ps.Config{Log: o.Log, Metrics: m, Shutdown: func() { close(shutdown); stopRegistering() },
		// Hot standbys (docs/replication.md): the shard this process
		// serves, and how, as a primary, it reaches its standby.
		Shard: o.Task.Index, Dial: replicaDialer(o), DataAddr: daddr, Store: o.checkpointStore(), Now: o.Now})
	defer srv.Close()
	maxRecv := psMaxRecv(o.Run, o.MaxMessageBytes)
	g := o.grpcServer(maxRecv, func(reason string) { m.RejectedRequests.WithLabelValues(reason).Inc() })
	// The data plane learns the shard's push size from its Init, or from
	// the snapshot a standby installs (ds is set before anything is
	// served).
	var ds *dataplane.Server
	api := psAPI{Server: srv, initialised: func(req *pb.InitRequest) {
		if ds != nil {
			ds.SetPushSize(pushSize(req))
		}
	}}
	if dlis != nil {
		ds = dataplane.NewServer(api, dlis, dataplane.Config{MaxPayload: maxRecv, Limits: o.dataLimits(), Log: o.Log, Metrics: m, Auth: o.Auth, TLS: o.dataTLS()})
		go ds.Serve()
		defer ds.Close()
		o.Log.Info("tcp data plane listening", "addr", daddr)
	}
	pb.RegisterParameterServerServer(g, api)
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	defer g.Stop()
	o.Log.Info("parameter server listening", "addr", addr)

	closeChief, err := o.registerPS(registering, shutdown, addr)
	if err != nil {
		return err
	}
	defer closeChief()
	select {
	case <-shutdown:
		g.GracefulStop()
		return nil
	case err := <-served:
		return fmt.Errorf("grpc server: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// registerPS registers the PS at addr with the chief; a shutdown that
// ends the registration is no error. The connection to the chief stays
// open until the returned function closes it.
func (o Options) registerPS(ctx context.Context, shutdown <-chan struct{}, addr string) (func() error, error) {
	conn, err := o.dial(o.Cluster.Chief[0])
	if err != nil {
		return nil, err
	}
	if _, err := o.register(ctx, pb.NewChiefClient(conn), nil, addr); err != nil {
		select {
		case <-shutdown: // ended by the shutdown: the PS stops
		default:
			conn.Close()
			return nil, err
		}
	}
	return conn.Close, nil
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
func psGCPercent(r config.Run) int {
	switch {
	case r.DataPlane == config.GRPC && r.PSReplicas > 0:
		return 100
	case r.DataPlane == config.GRPC:
		return 50
	}
	return 10
}

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
	return o.TLS.ServerTLS()
}

// checkpointStore is where a PS writes its shard (nil: no checkpoints).
func (o Options) checkpointStore() *checkpoint.Store {
	if o.Run.CheckpointDir == "" {
		return nil
	}
	return checkpoint.NewStore(checkpoint.OSFS{}, o.Run.CheckpointDir, o.Run.KeepCheckpoints).WithLog(o.Log).WithMode(checkpoint.DirMode(o.Run.CheckpointMode))
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
