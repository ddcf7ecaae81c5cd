// Package task builds and runs one task of a cluster — a PS shard, a
// worker or the chief — from a cluster description and a run
// configuration. NewPS, NewChief and NewWorker do the wiring (serving,
// dialing, registration, data, checkpoints) around the ps, worker and
// chief packages from the dependencies they are given (Network, the
// data, a checkpoint filesystem, metrics); RunPS, RunChief and RunWorker
// are the processes of `pstrain task`, which give them real listeners,
// TCP, the data directory and a metrics endpoint. The in-process cluster
// (package testcluster) calls the same constructors. cmd/pstrain only
// parses flags.
package task

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/retry"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/dataplane"
	"github.com/pstrain/pstrain/transport/pbcodec"
	"github.com/pstrain/pstrain/transport/tlsconf"
	"github.com/pstrain/pstrain/worker"
)

// Version is reported in pstrain_build_info.
const Version = "0.1.0"

// Options are what every task needs besides the run configuration.
type Options struct {
	Cluster cluster.Spec
	Task    cluster.Task
	Run     config.Run
	// MetricsAddr is where /metrics and /healthz are served ("" = off).
	MetricsAddr string
	// WebConfigFile is the exporter web config file (TLS, basic auth)
	// the metrics endpoint serves with ("" = plain HTTP).
	WebConfigFile string
	// HostMetrics adds the host's load, CPU and memory to the metrics
	// (pstrain_host_*): one task per host is enough.
	HostMetrics bool
	// DataAddr is where a PS's TCP data plane listens ("" =
	// DefaultDataAddr of the task's address).
	DataAddr string
	// ConnectTimeout bounds waiting for the chief or a PS.
	ConnectTimeout time.Duration
	// MaxMessageBytes bounds a gRPC message (both directions; a PS
	// bounds what it receives further by its model, psMaxRecv).
	MaxMessageBytes int
	// MaxConnections bounds the connections each listener of the task
	// serves at once (0: DefaultMaxConnections).
	MaxConnections int
	// MaxBufferedBytes bounds the push payloads a PS's data plane
	// buffers at once (0: dataplane.DefaultMaxBuffered).
	MaxBufferedBytes int64
	// IdleTimeout closes a connection without a request for this long
	// (0: dataplane.DefaultIdleTimeout).
	IdleTimeout time.Duration
	Log         *slog.Logger
	// TLS, when set, puts every gRPC connection under mutual TLS.
	TLS *tlsconf.Config
	// Auth is the run's token: the task registers with it and signs its
	// calls with the session the chief issues; its servers refuse calls
	// without a valid session (transport/auth). Required.
	Auth *auth.Keyring
	// Now is the clock of registrations (time.Now when nil).
	Now func() time.Time
	// GradientFaults poison workers' gradients (tests:
	// --fault-gradient); a worker applies those naming its index.
	GradientFaults []worker.GradientFault

	creds  *auth.Client                                             // this task's session, set by prepare
	dialer func(ctx context.Context, addr string) (net.Conn, error) // Network.Dialer, set by prepare
}

// prepare checks o, makes the task's session holder and takes the
// dialer of n.
func (o *Options) prepare(n Network) error {
	if o.Auth == nil {
		return errors.New("no run token: pass --auth-token-file (make one with `pstrain token FILE`; every task of the run needs the same file)")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.creds = &auth.Client{Keys: o.Auth, Role: o.Task.Type, Index: o.Task.Index, Now: o.Now}
	o.dialer = n.Dialer
	return nil
}

// DefaultMetricsAddr derives a task's metrics address from its gRPC
// address: same host, port + 1000.
func DefaultMetricsAddr(grpcAddr string) (string, error) { return offsetPort(grpcAddr, 1000) }

// DefaultDataAddr derives a PS's TCP data-plane address from its gRPC
// address: same host, port + 2000. A fixed port, not a free one picked at
// start: a port picked by the kernel can be one another task of the
// cluster is about to bind.
func DefaultDataAddr(grpcAddr string) (string, error) { return offsetPort(grpcAddr, 2000) }

func offsetPort(addr string, off int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("port %q: %w", port, err)
	}
	if p+off > 65535 {
		return "", fmt.Errorf("%s: port %d + %d is past 65535; give the address explicitly", addr, p, off)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+off)), nil
}

// reconnect is how a task's gRPC connections retry a peer they cannot
// reach: gRPC's default backoff grows to 2 minutes, during which every
// call fails at once; a cluster's peers restart within seconds
// (docs/recovery.md), so the wait between attempts stops at 2 s.
func reconnect() grpc.ConnectParams {
	return grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
		MinConnectTimeout: 5 * time.Second,
	}
}

// dial is a gRPC connection to the peer at addr, signed with the task's
// session, through the Network's dialer when there is one.
func (o Options) dial(addr string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = o.TLS.ClientCredentials()
	}
	return dial(addr, o.dialer, creds, o.creds, o.MaxMessageBytes)
}

// Dial is a gRPC connection to the task at addr as a task makes it
// (messages encoded by pbcodec),
// without TLS: calls signed as sign, messages up to maxMessageBytes
// either way, through n's Dialer when set. For a harness's own clients
// of its tasks (package testcluster).
func Dial(n Network, addr string, sign *auth.Client, maxMessageBytes int) (*grpc.ClientConn, error) {
	return dial(addr, n.Dialer, insecure.NewCredentials(), sign, maxMessageBytes)
}

func dial(addr string, dialer func(context.Context, string) (net.Conn, error), creds credentials.TransportCredentials, sign *auth.Client, maxMsg int) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithChainUnaryInterceptor(sign.Unary()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg), grpc.ForceCodecV2(pbcodec.New())),
		grpc.WithConnectParams(reconnect())}
	target := addr
	if dialer != nil {
		// The dialer gets the address as it stands.
		opts = append(opts, grpc.WithContextDialer(dialer))
		target = "passthrough:///" + addr
	}
	c, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return c, nil
}

// dataPlaneClient returns a client of the TCP data plane of the PS that
// gc reaches: the PS reports where that listens (its --data-addr) in
// Status, asked again after every broken connection.
func (o Options) dataPlaneClient(gc pb.ParameterServerClient) *dataplane.Client {
	return o.dataPlaneClientWith(gc, func(string) {})
}

// dataPlaneClientWith is dataPlaneClient that tells resolved every
// address the PS reports ("": it has no data plane).
func (o Options) dataPlaneClientWith(gc pb.ParameterServerClient, resolved func(addr string)) *dataplane.Client {
	return newDataPlaneClient(gc, o.dataPlaneDeps(), resolved)
}

// dataPlaneDeps are the task's data-plane clients' dependencies.
func (o Options) dataPlaneDeps() dataPlaneConf {
	d := dataPlaneConf{MaxPayload: o.MaxMessageBytes, Sign: o.creds}
	if o.TLS != nil {
		d.TLS = dataplane.WithPrivacy(o.TLS.ClientTLS(), o.Run.DataPlanePrivacy == config.Integrity)
	}
	return d
}

// BindAddr is where a task listens to be reached at addr: addr itself
// when its host is a loopback address or localhost (a local cluster stays
// off the network), else every interface on addr's port. A host name (a
// Kubernetes Service or pod DNS name) may not resolve from inside the
// task before the task is up, or resolve to a Service's virtual address,
// and an outside address (behind NAT) may belong to no interface of this
// machine; the cluster still reaches the task on its port. The gRPC
// listener, a PS's data plane and the metrics endpoint all bind this way.
func BindAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if !tlsconf.IsLoopbackHost(host) {
		host = ""
	}
	return net.JoinHostPort(host, port), nil
}

// listen binds the task's own address. A port in use is a clear error.
func (o Options) listen() (net.Listener, string, error) {
	addr, err := o.Cluster.Addr(o.Task)
	if err != nil {
		return nil, "", err
	}
	bind, err := BindAddr(addr)
	if err != nil {
		return nil, "", err
	}
	lis, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, "", fmt.Errorf("%s cannot listen on %s (port in use? see --cluster): %w", o.Task, addr, err)
	}
	return lis, addr, nil
}

// listenData binds the TCP data plane (DataAddr, or the task's address
// with port + 2000) and returns the address workers dial.
func (o Options) listenData(grpcAddr string) (net.Listener, string, error) {
	addr := o.DataAddr
	if addr == "" {
		var err error
		if addr, err = DefaultDataAddr(grpcAddr); err != nil {
			return nil, "", err
		}
	}
	bind, err := BindAddr(addr)
	if err != nil {
		return nil, "", fmt.Errorf("--data-addr %q: %w", addr, err)
	}
	lis, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, "", fmt.Errorf("%s cannot listen for its data plane on %s (port in use? see --data-addr): %w", o.Task, addr, err)
	}
	return lis, addr, nil
}

// registry is the task's metrics registry: process, Go runtime, build
// info, and the host's metrics when o.HostMetrics.
func (o Options) registry() *prometheus.Registry {
	return metrics.NewRegistryWith(metrics.RegistryOptions{Version: Version, Host: o.HostMetrics})
}

// serveMetrics starts the metrics server; the returned func stops it.
func (o Options) serveMetrics(ctx context.Context, reg prometheus.Gatherer) (func(), error) {
	if o.MetricsAddr == "" {
		return func() {}, nil
	}
	bind, err := BindAddr(o.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %q: %w", o.MetricsAddr, err)
	}
	srv := metrics.NewServer(reg, nil, o.Log)
	if err := srv.StartWebConfig(ctx, bind, o.WebConfigFile); err != nil {
		return nil, err
	}
	o.Log.Info("metrics", "url", srv.URL()+metrics.MetricsPath, "addr", o.MetricsAddr)
	return func() { srv.Close() }, nil
}

// register announces this task to the chief, retrying until it answers.
// A configuration mismatch is returned at once. A PS passes a nil spec: it
// never loads the data the model's shape comes from, and its shard's shape
// arrives with Init.
func (o Options) register(ctx context.Context, client pb.ChiefClient, spec *model.Spec, addr string) (*pb.RegisterResponse, error) {
	chiefAddr := o.Cluster.Chief[0]
	var resp *pb.RegisterResponse
	retryable := retry.OnCodes(codes.Unavailable, codes.DeadlineExceeded)
	needsTLS := false
	err := retry.Do(ctx, retry.Policy{First: 50 * time.Millisecond, Max: time.Second, Patience: o.ConnectTimeout,
		Retryable: func(err error) bool {
			// A plaintext task against a TLS chief sees broken connections
			// that look like a chief still starting: ask the port once.
			if o.TLS == nil && tlsconf.IsPlaintextToTLS(err) && tlsconf.SpeaksTLS(ctx, chiefAddr, 2*time.Second) {
				needsTLS = true
				return false
			}
			return retryable(err)
		},
		OnRetry: func(attempt int, _ error) {
			if attempt == 1 {
				o.Log.Info("waiting for the chief", "addr", chiefAddr)
			}
		}},
		func(ctx context.Context) error {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			var err error
			resp, err = client.Register(cctx, &pb.RegisterRequest{Role: o.Task.Type, Index: int32(o.Task.Index), Address: addr,
				ModelSpec: specProto(spec), Settings: convert.Settings(o.Run), Pid: int32(os.Getpid())})
			return err
		})
	var gaveUp *retry.GaveUpError
	switch {
	case err == nil:
		return resp, nil
	case err == ctx.Err():
		return nil, err
	case needsTLS:
		return nil, fmt.Errorf("chief at %s requires mutual TLS and %s has no certificate: pass --tls-dir DIR (the directory pstrain certs made) or --tls-cert, --tls-key and --tls-ca", chiefAddr, o.Task)
	case errors.As(err, &gaveUp) && tlsconf.IsTLSError(gaveUp.Err):
		return nil, fmt.Errorf("chief at %s: TLS failure for %v (--connect-timeout %v; check --tls-dir/--tls-ca): %s", chiefAddr, gaveUp.After.Round(time.Millisecond), o.ConnectTimeout, tlsconf.Describe(gaveUp.Err))
	case errors.As(err, &gaveUp):
		return nil, fmt.Errorf("chief at %s unreachable for %v (--connect-timeout %v): %w", chiefAddr, gaveUp.After.Round(time.Millisecond), o.ConnectTimeout, gaveUp.Err)
	}
	return nil, fmt.Errorf("chief at %s refused %s: %s", chiefAddr, o.Task, status.Convert(err).Message())
}

// specFor is the model for the data set's shape.
func specFor(r config.Run, ds *dataset.Dataset) model.Spec {
	return r.Spec(ds.Dim, ds.Classes)
}

// specProto is s on the wire (nil: a task that checks no model).
func specProto(s *model.Spec) *pb.ModelSpec {
	if s == nil {
		return nil
	}
	return convert.ModelSpec(*s)
}
