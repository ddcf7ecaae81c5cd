package task

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/ratelog"
	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
)

// ChiefOptions are the chief's own settings.
type ChiefOptions struct {
	RunID      string
	ReportPath string    // "" = no report file
	Progress   io.Writer // progress lines (nil = none)
	EvalBatch  int
	// StatePath is where the chief keeps what a restarted chief needs
	// ("" = nowhere: a restarted chief loses the report's history).
	StatePath string
	// ScaleFile is where `pstrain scale` asks for another worker count
	// ("" = nowhere).
	ScaleFile string
}

// ChiefDeps are what the chief takes from outside: the network, the
// model and data it scores, where checkpoints go, its metrics.
type ChiefDeps struct {
	Network
	Spec model.Spec
	// Test is the evaluation set (nil: the chief does not evaluate).
	Test *dataset.Dataset
	// CTRTest is a CTR model's evaluation set instead, and PlantedAUC
	// the best AUC achievable on it (synthetic data; 0: unknown), for
	// the report.
	CTRTest    ctrdata.Source
	PlantedAUC float64
	// TrainN is the number of training samples (after --data-fraction).
	TrainN int
	// FS holds Run.CheckpointDir (nil: the operating system's).
	FS checkpoint.FS
	// Metrics are the chief's metrics (nil: unregistered ones).
	Metrics *metrics.Chief
	Builds  Builds
	// Tweak, if set, has the last word on the chief's configuration
	// (tests: the poll interval, progress hooks).
	Tweak func(*chief.Config)
}

// Chief is the chief task: chief.Chief served as pb.ChiefServer over the
// connections to every PS process. NewChief builds it, Serve serves it,
// Run runs it; Close stops it.
type Chief struct {
	o        Options
	co       ChiefOptions
	lis      Network
	spec     model.Spec
	planted  float64
	chief    *chief.Chief
	g        *grpc.Server
	refusals *ratelog.Logger
	serving  sync.WaitGroup
	closers  closers
}

// NewChief builds the chief of o's cluster from its dependencies: it
// dials every PS process (lazily: nothing waits for them here), builds
// the evaluator and the gRPC server. On error it closes what it opened,
// the listener too.
func NewChief(o Options, co ChiefOptions, d ChiefDeps) (_ *Chief, err error) {
	if err := o.prepare(d.Network); err != nil {
		return nil, err
	}
	c := &Chief{o: o, co: co, lis: d.Network, spec: d.Spec, planted: d.PlantedAUC}
	c.closers.add(func() { d.Listener.Close() })
	defer func() {
		if err != nil {
			c.closers.closeAll()
		}
	}()
	// The chief issues sessions; its own is one like any other.
	session, err := auth.NewSession()
	if err != nil {
		return nil, err
	}
	o.creds.SetSession(session)
	cfg, err := c.config(d)
	if err != nil {
		return nil, err
	}
	if c.chief, err = chief.New(cfg); err != nil {
		return nil, err
	}
	m := cfg.Metrics
	c.g = o.grpcServer(chiefMaxRecv, func(reason string) { m.RejectedRequests.WithLabelValues(reason).Inc() })
	pb.RegisterChiefServer(c.g, c.chief)
	c.refusals = ratelog.New(o.Log, refusalLogEvery, nil)
	return c, nil
}

// config is the chief's configuration: its shards' clients, evaluator,
// checkpoint store and progress lines.
func (c *Chief) config(d ChiefDeps) (chief.Config, error) {
	o, co := c.o, c.co
	pss, err := c.dialAll(o.Cluster.PS)
	if err != nil {
		return chief.Config{}, err
	}
	standbys, err := c.dialAll(o.Cluster.Standby)
	if err != nil {
		return chief.Config{}, err
	}
	if co.RunID == "" {
		co.RunID = fmt.Sprintf("run-%d", time.Now().UnixNano())
		c.co.RunID = co.RunID
	}
	m := d.Metrics
	if m == nil {
		m = metrics.NewChief(nil)
	}
	cfg := chief.Config{Run: o.Run, Spec: d.Spec, RunID: co.RunID, PS: pss, Standbys: standbys, TrainN: d.TrainN,
		Log: o.Log, Metrics: m, StartupTimeout: o.ConnectTimeout, StatePath: co.StatePath, ScaleFile: co.ScaleFile}
	if d.Test != nil || d.CTRTest != nil {
		if cfg.Evaluator, err = c.evaluator(d); err != nil {
			return chief.Config{}, err
		}
	}
	if o.Run.CheckpointDir != "" {
		cfg.Store = checkpoint.NewStore(checkpointFS(d.FS), o.Run.CheckpointDir, o.Run.KeepCheckpoints).WithLog(o.Log).WithMode(checkpoint.DirMode(o.Run.CheckpointMode))
	}
	if co.Progress != nil {
		var lines progressLines
		cfg.OnProgress = func(p chief.Progress) {
			if s, ok := lines.next(p); ok {
				fmt.Fprintln(co.Progress, s)
			}
		}
	}
	if d.Tweak != nil {
		d.Tweak(&cfg)
	}
	return cfg, nil
}

// evaluator scores the model on d.Test, in batches of EvalBatch (1000 by
// default, at most the test set).
func (c *Chief) evaluator(d ChiefDeps) (*chief.Evaluator, error) {
	batch := c.co.EvalBatch
	if batch <= 0 {
		batch = 1000
	}
	ev, err := build(d.Builds, func() (*chief.Evaluator, error) {
		if d.CTRTest != nil {
			return chief.NewCTREvaluator(d.Spec, d.CTRTest, batch, chief.TableConfigs(c.o.Run, d.Spec))
		}
		return chief.NewEvaluator(d.Spec, d.Test, batch, c.o.Run.Seed)
	})
	if err != nil {
		return nil, err
	}
	c.closers.add(func() { ev.Close() })
	return ev, nil
}

// dialAll connects to the PS processes at addrs (ps/N, or standby/N with
// hot standbys: the chief routes what is meant for a shard to its
// primary). On the TCP data plane their pulls (the evaluation's) go over
// it, and so do a CTR model's row reads where a worker's rows would
// (rowsOnDataPlane).
func (c *Chief) dialAll(addrs []string) ([]chief.PS, error) {
	var out []chief.PS
	for _, a := range addrs {
		conn, err := c.o.dial(a)
		if err != nil {
			return nil, err
		}
		c.closers.add(func() { conn.Close() })
		var client pb.ParameterServerClient = pb.NewParameterServerClient(conn)
		if c.o.Run.DataPlane == config.TCP {
			dc := c.o.dataPlaneClient(client)
			c.closers.add(func() { dc.Close() })
			client = chiefClient(c.o.Run, client, dc)
		}
		out = append(out, chief.PS{Addr: a, Client: client})
	}
	return out, nil
}

// Chief is the chief.Chief the task serves.
func (c *Chief) Chief() *chief.Chief { return c.chief }

// Addr is where the chief serves.
func (c *Chief) Addr() string { return c.lis.Addr }

// Serve serves the chief's gRPC API on its listener, under the task's
// connection limit, until Close.
func (c *Chief) Serve() {
	lis := c.o.limitListener(c.lis.Listener, c.refusals, nil)
	c.serving.Add(1)
	go func() {
		defer c.serving.Done()
		// nil after Stop; ErrServerStopped if stopped before it served.
		if err := c.g.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			c.o.Log.Error("chief gRPC server", "err", err)
		}
	}()
	c.o.Log.Info("chief listening", "addr", c.lis.Addr, "run", c.co.RunID, "model", c.spec.String(), "mode", c.o.Run.Mode)
}

// Run coordinates the run and returns its report. Once the run is over,
// also after an interrupt, it tells the PS processes to exit, and writes
// the report to ReportPath.
func (c *Chief) Run(ctx context.Context) (*report.Report, error) {
	rep, err := c.chief.Run(ctx)
	if err != nil {
		return nil, err
	}
	rep.BLAS = blas.Describe()
	if c.spec.IsCTR() {
		rep.PlantedAUC = c.planted
	}
	c.chief.Shutdown(context.WithoutCancel(ctx))
	if c.co.ReportPath != "" {
		if err := rep.Write(c.co.ReportPath); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// Close stops serving and closes every connection and the evaluator.
// Call it once Run has returned (or was never called).
func (c *Chief) Close() {
	c.g.Stop()
	c.serving.Wait()
	c.refusals.Flush(true)
	c.closers.closeAll()
}

// RunChief is the chief process: it loads the evaluation set, serves
// metrics, binds the chief's address and runs NewChief's chief.
func RunChief(ctx context.Context, o Options, co ChiefOptions) (*report.Report, error) {
	if err := o.prepare(Network{}); err != nil {
		return nil, err
	}
	if err := blas.Setup(1); err != nil {
		return nil, err
	}
	deps, closeData, err := evalData(o.Run)
	if err != nil {
		return nil, err
	}
	defer closeData()
	reg := o.registry()
	m := metrics.NewChief(reg)
	// Metrics stay up while an interrupted run winds down.
	stopMetrics, err := o.serveMetrics(context.WithoutCancel(ctx), reg)
	if err != nil {
		return nil, err
	}
	defer stopMetrics()
	lis, addr, err := o.listen()
	if err != nil {
		return nil, err
	}
	deps.Network, deps.Metrics = Network{Listener: lis, Addr: addr}, m
	c, err := NewChief(o, co, deps)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.Serve()
	return c.Run(ctx)
}

// evalData is what the chief process loads of the data: the model spec,
// the test set and the training set's size (after --data-fraction).
// The chief scores and counts epochs; it never trains.
func evalData(r config.Run) (ChiefDeps, func(), error) {
	if r.Model.IsCTR() {
		set, err := ctrdata.Open(r.DataDir, r.Dataset)
		if err != nil {
			return ChiefDeps{}, nil, err
		}
		s := set.Train.Schema()
		d := ChiefDeps{Spec: r.CTRSpec(s.Dense, s.Cat), CTRTest: set.Test, TrainN: ctrTrainN(r, set.Train)}
		if set.Meta != nil {
			d.PlantedAUC = set.Meta.PlantedAUC
		}
		return d, func() { set.Close() }, nil
	}
	test, trainN, err := dataset.LoadEval(r.DataDir, r.Dataset)
	if err != nil {
		return ChiefDeps{}, nil, err
	}
	if r.DataFraction < 1 {
		trainN = dataset.SubsetSize(r.DataFraction, trainN)
	}
	return ChiefDeps{Spec: specFor(r, test), Test: test, TrainN: trainN}, func() {}, nil
}
