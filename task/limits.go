package task

import (
	"context"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/ratelog"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/compress"
	"github.com/pstrain/pstrain/transport/connlimit"
	"github.com/pstrain/pstrain/transport/dataplane"
	"github.com/pstrain/pstrain/transport/pbcodec"
)

// What a task's listeners hold at most, whatever their clients send
// (docs/security.md, "Limits").
const (
	// chiefMaxRecv bounds a message to the chief: registrations and
	// heartbeats, a few KiB at most.
	chiefMaxRecv = 4 << 20
	// maxStreams bounds the RPCs under way on one gRPC connection. A
	// worker has at most a pull and a push per shard at once, the chief
	// a few (evaluation pulls, checkpoints, status); a client past the
	// limit waits for a stream, it is not refused.
	maxStreams = 64
	// keepaliveTime and keepaliveTimeout: a gRPC server pings a client
	// connection silent that long, and drops it if the ping is not
	// answered in time, so a vanished peer frees its connection.
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
	// keepaliveMinTime: a client pinging more often is sent away
	// (gRPC's enforcement; pstrain's own clients do not ping).
	keepaliveMinTime = 30 * time.Second
	// refusalLogEvery is the interval of the rate-limited refusal logs.
	refusalLogEvery = 5 * time.Second
)

// DefaultMaxConnections is the connection limit of each of a task's
// listeners when --max-connections is 0: twice the connections the
// cluster's tasks make to it (a restarted task's old connections may
// linger until they are found dead): one from the chief and each PS,
// three from each worker (its pushes', its pulls' on the data plane,
// worker.Shard.Puller, and a CTR model's rows'), plus 64 for tools
// (pstrain top, Prometheus is on the metrics port) and reconnections.
func DefaultMaxConnections(spec cluster.Spec) int {
	return 2*(len(spec.Chief)+len(spec.PS)+3*len(spec.Worker)) + 64
}

func (o Options) maxConnections() int {
	if o.MaxConnections > 0 {
		return o.MaxConnections
	}
	return DefaultMaxConnections(o.Cluster)
}

func (o Options) idleTimeout() time.Duration {
	if o.IdleTimeout > 0 {
		return o.IdleTimeout
	}
	return dataplane.DefaultIdleTimeout
}

// dataLimits are the PS data plane's limits: the budget always holds a
// push from every worker and one more, so no push of a healthy cluster
// waits for another's buffer.
func (o Options) dataLimits() dataplane.Limits {
	return dataplane.Limits{MaxConns: o.maxConnections(), MaxBuffered: o.MaxBufferedBytes,
		MinBufferedPushes: o.Run.Workers + 1, IdleTimeout: o.idleTimeout()}
}

// psMaxRecv bounds a message to a PS, over gRPC or the data plane. The
// largest is Init: the shard's parameters and its optimizer state (one
// more copy for momentum, two for adam), its workers' data positions and
// its options; a push is one copy of the shard's gradient. The whole model
// bounds a shard, so (1 + optimizer slots) x the model's bytes + 1 MiB
// (and at most --max-message-mb). A PS never reads the data: for an
// idx: data set, whose sample size only its files say, the bound is
// --max-message-mb. With hot standbys (--ps-replicas 1) the largest is a
// primary's snapshot to its standby (Replicate: an Init and the shard's
// state beside it), bounded by twice that.
func psMaxRecv(r config.Run, ceiling int) int {
	dim, classes, ok := dataset.NamedShape(r.Dataset)
	if !ok {
		return ceiling
	}
	slots := 0
	if opt, err := optim.New(optim.Config{Name: r.Optimizer}, 1); err == nil {
		st, _ := opt.State()
		slots = len(st)
	}
	copies := int64(1 + slots)
	if r.PSReplicas > 0 {
		// A snapshot: parameters, optimizer state, and the sync step
		// under way (its sum, or up to one kept copy per worker with the
		// trimmed mean) as float32 bytes; the bound keeps room for twice
		// that.
		copies += 2 * int64(1+r.Workers)
	}
	n := copies*4*int64(r.Spec(dim, classes).NumParams()) + 16*int64(r.Workers) + 1<<20
	return int(min(n, int64(ceiling)))
}

// pushSize is the bytes of a push to a shard that req initialises: its
// parameters as float32, halved with --wire-dtype bf16, or their
// encoding with --compress.
func pushSize(req *pb.InitRequest) int {
	n := len(req.Params)
	o, err := ps.OptionsFromProto(req.ShardOptions)
	switch {
	case err == nil && o.Compress.Push.Kind != compress.None:
		return o.Compress.Push.Codec().EncodedLen(n / 4)
	case err == nil && o.WireDType == config.BF16:
		n /= 2
	}
	return n
}

// psAPI is the PS's gRPC service: the shard's server, whose successful
// Inits also tell the data plane the shard's push size.
type psAPI struct {
	*ps.Server
	initialised func(*pb.InitRequest)
}

// Replicate is the shard's Replicate; a standby that installed its
// primary's snapshot tells the data plane the shard's push size too (it
// gets no Init).
func (a psAPI) Replicate(ctx context.Context, b *pb.ReplicaBatch) (*pb.ReplicaAck, error) {
	ack, err := a.Server.Replicate(ctx, b)
	if err == nil && len(b.Ops) > 0 {
		if snap := b.Ops[0].GetSnapshot(); snap != nil && snap.Init != nil {
			a.initialised(snap.Init)
		}
	}
	return ack, err
}

func (a psAPI) Init(ctx context.Context, req *pb.InitRequest) (*pb.InitResponse, error) {
	resp, err := a.Server.Init(ctx, req)
	if err == nil {
		a.initialised(req)
	}
	return resp, err
}

// grpcServer returns a task's gRPC server: calls without a valid
// session of the run refused (refused is told each refusal's reason),
// messages up to maxRecv bytes in and --max-message-mb out, maxStreams
// RPCs per connection, idle connections closed after the idle timeout (a
// client reconnects when it next calls), silent ones pinged and dropped
// if dead; messages encoded by pbcodec.
func (o Options) grpcServer(maxRecv int, refused func(reason string)) *grpc.Server {
	guard := &auth.Guard{Keys: o.Auth, Now: o.Now, Refused: refused}
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(guard.Unary()),
		grpc.MaxRecvMsgSize(maxRecv), grpc.MaxSendMsgSize(o.MaxMessageBytes),
		grpc.MaxConcurrentStreams(maxStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: o.idleTimeout(),
			Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(pbcodec.New()),
	}
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(o.TLS.ServerCredentials(o.Log, refusalLogEvery, nil)))
	}
	return grpc.NewServer(opts...)
}

// limitListener bounds the connections lis serves at once to
// --max-connections; one past it is closed, logged on log (rate-limited)
// and passed to counted (may be nil).
func (o Options) limitListener(lis net.Listener, log *ratelog.Logger, counted func()) net.Listener {
	n := o.maxConnections()
	return connlimit.New(lis, n, func(c net.Conn) {
		if counted != nil {
			counted()
		}
		log.Warn("limit", "gRPC connection refused: too many open (--max-connections)", "remote", c.RemoteAddr().String(), "limit", n)
	})
}
