package testcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/test/bufconn"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/task"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/wire"
)

// Transport is how the cluster's gRPC connections are carried.
type Transport int

const (
	// Bufconn carries gRPC over in-memory listeners
	// (google.golang.org/grpc/test/bufconn): no ports.
	Bufconn Transport = iota
	// Loopback carries gRPC over TCP on 127.0.0.1, as between the task
	// processes of `pstrain run`.
	Loopback
)

// DefaultMaxMessageBytes matches the tasks' default --max-message-mb.
const DefaultMaxMessageBytes = 256 << 20

// bufconnSize is the buffer of each in-memory connection.
const bufconnSize = 1 << 20

// Config describes a cluster. Run and Spec are required; the rest has
// defaults.
type Config struct {
	// Run is the run every task shares: Run.PS shards, Run.Workers
	// worker slots, mode, data plane, checkpoint settings.
	Run  config.Run
	Spec model.Spec
	// RunID names the run when there is no chief ("test" if empty); with
	// a chief it is the chief's run id and workers learn it by
	// registering.
	RunID     string
	Transport Transport
	// MaxMessageBytes bounds a gRPC message and a data-plane payload
	// (default DefaultMaxMessageBytes).
	MaxMessageBytes int
	// Log receives every task's logs (default: discarded).
	Log *slog.Logger
	// PSMetrics, if set, gives shard s its metrics; it is called once per
	// shard, and a restarted shard keeps them (nil: unregistered ones).
	PSMetrics func(s int) *metrics.PS

	// Chief, if set, runs a chief; nil runs none.
	Chief *ChiefConfig
	// MaxVersion is where training ends when there is no chief (0: never).
	MaxVersion int64
	// Train is the training set: the chief's TrainN, and what workers
	// read by default (their data shard of it). Required with a chief.
	Train *dataset.Dataset
	// CheckpointFS holds Run.CheckpointDir for the chief and every PS
	// (default: a new checkpoint.MemFS). Unused without a CheckpointDir.
	CheckpointFS checkpoint.FS
	// RetryTimeout is the workers' patience with an unavailable shard
	// (default 10s).
	RetryTimeout time.Duration
}

// TB is the part of testing.TB that New uses.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// Cluster is a running in-process cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	cfg   Config
	plan  partition.Plan
	ctx   context.Context // ends at Close
	stop  context.CancelFunc
	wg    sync.WaitGroup // every goroutine the cluster started
	ps    []*PS
	chief *Chief
	fs    checkpoint.FS // nil without a checkpoint dir
	// keys is the run's token (a fresh one per cluster); own is the
	// cluster's own identity towards the shards: the chief's, as the
	// harness initialises them like a chief.
	keys *auth.Keyring
	self *auth.Client
	// chiefLis and chiefAddr are the chief's listener and address, bound
	// before the shards start (they register there); none without a
	// chief.
	chiefLis  net.Listener
	chiefAddr string

	mu      sync.Mutex
	psAddrs []string                     // every shard's address, once it has served
	bufs    map[string]*bufconn.Listener // Bufconn: the serving listener of each address
	conns   []io.Closer                  // the cluster's own connections, closed last
	workers []*Worker                    // every incarnation, in start order
	errs    []error
	closed  bool
}

// New starts a cluster for a test: it fails the test if the cluster
// cannot start, and closes it when the test ends (logging every
// goroutine's error, if any).
func New(t TB, cfg Config) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("testcluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Logf("testcluster: close: %v", err)
		}
		for _, err := range c.Errors() {
			t.Logf("testcluster: %v", err)
		}
	})
	return c
}

// Start starts the shards and, if configured, the chief. ctx bounds the
// start-up only (serving, registration, initialising the shards); the
// cluster runs until Close. Workers are started by StartWorker(s).
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.Run.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Spec.Validate(); err != nil {
		return nil, err
	}
	if cfg.Chief != nil && cfg.Train == nil {
		return nil, errors.New("testcluster: a cluster with a chief needs Config.Train")
	}
	if cfg.RunID == "" {
		cfg.RunID = "test"
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.RetryTimeout <= 0 {
		cfg.RetryTimeout = 10 * time.Second
	}
	plan, err := partition.New(cfg.Spec, cfg.Run.PS)
	if err != nil {
		return nil, err
	}
	token, err := auth.NewToken(nil)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, plan: plan, bufs: map[string]*bufconn.Listener{}, keys: auth.NewKeyring(token)}
	if c.self, err = c.session(auth.RoleChief, 0); err != nil {
		return nil, err
	}
	c.ctx, c.stop = context.WithCancel(context.Background())
	if cfg.Run.CheckpointDir != "" {
		c.fs = cfg.CheckpointFS
		if c.fs == nil {
			c.fs = checkpoint.NewMemFS()
		}
	}
	if err := c.start(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// start binds the chief's address (if any), serves every shard and then
// the chief, whom the shards register with, or initialises the shards
// itself without a chief.
func (c *Cluster) start(ctx context.Context) error {
	cfg := c.cfg
	c.psAddrs = make([]string, cfg.Run.PS)
	if cfg.Chief != nil {
		var err error
		if c.chiefLis, c.chiefAddr, err = c.listen(c.newAddr("chief")); err != nil {
			return err
		}
	}
	for s := 0; s < cfg.Run.PS; s++ {
		if err := c.startPS(s); err != nil {
			return err
		}
	}
	if cfg.Chief == nil {
		return c.initShards(ctx)
	}
	var err error
	if c.chief, err = c.startChief(*cfg.Chief); err != nil {
		return err
	}
	for _, p := range c.ps {
		if err := c.registerPS(ctx, p); err != nil {
			return err
		}
	}
	c.chief.run()
	return nil
}

// startPS serves shard s and dials it with the cluster's own client.
func (c *Cluster) startPS(s int) error {
	p := &PS{c: c, index: s, addr: c.newAddr(fmt.Sprintf("ps-%d", s))}
	if c.cfg.PSMetrics != nil {
		p.m = c.cfg.PSMetrics(s)
	}
	c.ps = append(c.ps, p)
	if err := p.serve(); err != nil {
		return err
	}
	conn, err := c.dial(p.Addr(), c.self)
	if err != nil {
		return err
	}
	c.own(conn)
	p.client = pb.NewParameterServerClient(conn)
	return nil
}

// initShards does the chief's initialisation without a chief: every shard
// gets its slice of Spec.Init(Run.Seed) and ends at MaxVersion.
func (c *Cluster) initShards(ctx context.Context) error {
	r := c.cfg.Run
	init := c.cfg.Spec.Init(uint64(r.Seed))
	perEpoch := 1.0 // a step schedule's epoch, with no training set: one step
	if c.cfg.Train != nil {
		perEpoch = chief.StepsPerEpoch(r, c.cfg.Train.N)
	}
	for s, p := range c.ps {
		flat := make([]float32, c.plan.Shards[s].Size)
		c.plan.Gather(s, init, flat)
		if _, err := p.client.Init(ctx, &pb.InitRequest{RunId: c.cfg.RunID, Shard: int32(s), NumShards: int32(r.PS),
			ShardOptions: ps.OptionsFor(r).Proto(), ModelSpec: convert.ModelSpec(c.cfg.Spec), Params: wire.Bytes(flat), MaxVersion: c.cfg.MaxVersion, StepsPerEpoch: perEpoch}); err != nil {
			return fmt.Errorf("testcluster: init ps/%d: %w", s, err)
		}
	}
	return nil
}

// Plan is the model's partition across the shards.
func (c *Cluster) Plan() partition.Plan { return c.plan }

// Config is the cluster's configuration, defaults filled in.
func (c *Cluster) Config() Config { return c.cfg }

// PS is shard s.
func (c *Cluster) PS(s int) *PS { return c.ps[s] }

// Chief is the chief (nil without one).
func (c *Cluster) Chief() *Chief { return c.chief }

// Checkpoints is a store over the run's checkpoint directory, for a test
// to look at (nil without Run.CheckpointDir).
func (c *Cluster) Checkpoints() *checkpoint.Store {
	if c.fs == nil {
		return nil
	}
	return c.store()
}

func (c *Cluster) store() *checkpoint.Store {
	return checkpoint.NewStore(c.fs, c.cfg.Run.CheckpointDir, c.cfg.Run.KeepCheckpoints).WithLog(c.cfg.Log).WithMode(checkpoint.DirMode(c.cfg.Run.CheckpointMode))
}

// Params reassembles the whole model from the shards' current state, with
// each shard's version.
func (c *Cluster) Params() ([][]float32, []int64, error) {
	out := make([][]float32, len(c.plan.Vars))
	for i, v := range c.plan.Vars {
		out[i] = make([]float32, v.Size())
	}
	var versions []int64
	for s, p := range c.ps {
		srv := p.Server()
		if srv == nil {
			return nil, nil, fmt.Errorf("testcluster: ps/%d is down", s)
		}
		v, params, _, _, err := srv.Snapshot()
		if err != nil {
			return nil, nil, fmt.Errorf("testcluster: ps/%d: %w", s, err)
		}
		c.plan.Scatter(s, params, out)
		versions = append(versions, v)
	}
	return out, versions, nil
}

// Errors lists the error of every goroutine the cluster started that
// ended in error, other than the expected end of a kill or of Close
// (a worker or chief whose context was cancelled, a server stopped).
func (c *Cluster) Errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.errs)
}

// Finish waits for the chief's report and for every worker, and returns
// the report with the first problem found: the chief's error, a
// worker's, or errors the cluster's goroutines reported.
func (c *Cluster) Finish(ctx context.Context) (*report.Report, error) {
	if c.chief == nil {
		return nil, errors.New("testcluster: Finish needs a cluster with a chief")
	}
	rep, err := c.chief.Wait(ctx)
	if err != nil {
		return nil, fmt.Errorf("chief: %w (other errors: %v)", err, c.Errors())
	}
	if err := c.WaitWorkers(ctx); err != nil {
		return rep, err
	}
	if errs := c.Errors(); len(errs) > 0 {
		return rep, fmt.Errorf("errors in the cluster: %v", errs)
	}
	return rep, nil
}

func (c *Cluster) record(task string, err error) {
	if err == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, fmt.Errorf("%s: %w", task, err))
}

// goroutine runs f under the cluster's WaitGroup.
func (c *Cluster) goroutine(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

// own registers a connection that Close closes.
func (c *Cluster) own(x io.Closer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conns = append(c.conns, x)
}

// Close stops every worker, the chief and every shard, closes every
// connection, and waits for every goroutine the cluster started. It is
// safe to call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	workers := slices.Clone(c.workers)
	c.mu.Unlock()
	c.stop()
	for _, w := range workers {
		<-w.done
	}
	if c.chief != nil {
		c.chief.close()
	} else if c.chiefLis != nil {
		c.chiefLis.Close()
	}
	for _, p := range c.ps {
		p.Kill()
	}
	c.mu.Lock()
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	var errs []error
	for _, x := range conns {
		if err := x.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	c.wg.Wait()
	return errors.Join(errs...)
}

// listen binds addr: an in-memory listener (Bufconn), or TCP on
// 127.0.0.1 (Loopback; "127.0.0.1:0" picks a port). It returns the
// address clients dial.
func (c *Cluster) listen(addr string) (net.Listener, string, error) {
	if c.cfg.Transport == Bufconn {
		return bufconn.Listen(bufconnSize), addr, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("testcluster: listen on %s: %w", addr, err)
	}
	return lis, lis.Addr().String(), nil
}

// newAddr is the address a new task listens on: its name over Bufconn,
// a free port over Loopback.
func (c *Cluster) newAddr(name string) string {
	if c.cfg.Transport == Bufconn {
		return name
	}
	return "127.0.0.1:0"
}

// publish makes a Bufconn listener the one dials of addr reach; nil
// takes it down (dials fail as on a closed port).
func (c *Cluster) publish(addr string, lis net.Listener) {
	if c.cfg.Transport != Bufconn {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if lis == nil {
		delete(c.bufs, addr)
		return
	}
	c.bufs[addr] = lis.(*bufconn.Listener)
}

func (c *Cluster) dialBufconn(ctx context.Context, addr string) (net.Conn, error) {
	c.mu.Lock()
	lis := c.bufs[addr]
	c.mu.Unlock()
	if lis == nil {
		return nil, fmt.Errorf("testcluster: dial %s: connection refused (the task is down)", addr)
	}
	return lis.DialContext(ctx)
}

// registerPatience is how long a shard retries its registration with the
// chief.
const registerPatience = 30 * time.Second

// options are the task options of task t of the cluster: its run, the
// cluster's addresses, the run's token, and patience with its peers.
func (c *Cluster) options(t cluster.Task, patience time.Duration) task.Options {
	return task.Options{Cluster: c.spec(), Task: t, Run: c.cfg.Run, ConnectTimeout: patience,
		MaxMessageBytes: c.cfg.MaxMessageBytes, Log: c.cfg.Log.With("task", t.String()), Auth: c.keys}
}

// spec is the cluster's addresses: the chief (if any) and every shard
// ("" for one that has not served yet).
func (c *Cluster) spec() cluster.Spec {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := cluster.Spec{PS: slices.Clone(c.psAddrs)}
	if c.chiefLis != nil {
		s.Chief = []string{c.chiefAddr}
	}
	return s
}

// setPSAddr notes shard s's address.
func (c *Cluster) setPSAddr(s int, addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.psAddrs[s] = addr
}

// network is a task's network: lis at addr, and over Bufconn a dialer
// that reaches the listener serving each address.
func (c *Cluster) network(lis net.Listener, addr string) task.Network {
	n := task.Network{Listener: lis, Addr: addr}
	if c.cfg.Transport == Bufconn {
		n.Dialer = c.dialBufconn
	}
	return n
}

// credentials is the identity of a task that registers with the chief
// (its session comes with the registration).
func (c *Cluster) credentials(role string, index int) *auth.Client {
	return &auth.Client{Keys: c.keys, Role: role, Index: index}
}

// session is an identity with a session of its own, for a task the
// harness runs without a chief to issue one.
func (c *Cluster) session(role string, index int) (*auth.Client, error) {
	s, err := auth.NewSession()
	if err != nil {
		return nil, err
	}
	a := c.credentials(role, index)
	a.SetSession(s)
	return a, nil
}

// dial returns a client connection to addr as the tasks make it. Over
// Bufconn it reaches whatever listener serves addr at each (re)connection,
// so it follows a restarted task.
// Calls are signed as who.
func (c *Cluster) dial(addr string, who *auth.Client) (*grpc.ClientConn, error) {
	conn, err := task.Dial(c.network(nil, ""), addr, who, c.cfg.MaxMessageBytes)
	if err != nil {
		return nil, fmt.Errorf("testcluster: %w", err)
	}
	return conn, nil
}
