package task

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/ratelog"
	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/dataset"
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

// RunChief coordinates the run and returns its report.
func RunChief(ctx context.Context, o Options, co ChiefOptions) (*report.Report, error) {
	if err := o.prepare(); err != nil {
		return nil, err
	}
	// The chief issues sessions; its own is one like any other.
	session, err := auth.NewSession()
	if err != nil {
		return nil, err
	}
	o.creds.SetSession(session)
	if err := blas.Setup(1); err != nil {
		return nil, err
	}
	// The chief scores and counts epochs; it never trains: the test set
	// and the training set's size are all it loads.
	test, trainN, err := dataset.LoadEval(o.Run.DataDir, o.Run.Dataset)
	if err != nil {
		return nil, err
	}
	if o.Run.DataFraction < 1 {
		trainN = dataset.SubsetSize(o.Run.DataFraction, trainN)
	}
	spec := specFor(o.Run, test)
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
	// Every PS process: ps/N, and standby/N with hot standbys (the
	// chief routes what is meant for a shard to its primary).
	var pss, standbys []chief.PS
	for _, procs := range []struct {
		addrs []string
		into  *[]chief.PS
	}{{o.Cluster.PS, &pss}, {o.Cluster.Standby, &standbys}} {
		for _, a := range procs.addrs {
			c, err := o.dial(a)
			if err != nil {
				return nil, err
			}
			defer c.Close()
			var client pb.ParameterServerClient = pb.NewParameterServerClient(c)
			if o.Run.DataPlane == config.TCP {
				dc := o.dataPlaneClient(client)
				defer dc.Close()
				client = PullsVia(client, dc)
			}
			*procs.into = append(*procs.into, chief.PS{Addr: a, Client: client})
		}
	}
	if co.EvalBatch <= 0 {
		co.EvalBatch = 1000
	}
	ev, err := chief.NewEvaluator(spec, test, co.EvalBatch, o.Run.Seed)
	if err != nil {
		return nil, err
	}
	defer ev.Close()
	if co.RunID == "" {
		co.RunID = fmt.Sprintf("run-%d", time.Now().UnixNano())
	}
	cfg := chief.Config{Run: o.Run, Spec: spec, RunID: co.RunID, PS: pss, Standbys: standbys, TrainN: trainN, Evaluator: ev,
		Log: o.Log, Metrics: m, StartupTimeout: o.ConnectTimeout, StatePath: co.StatePath,
		ScaleFile: co.ScaleFile}
	if o.Run.CheckpointDir != "" {
		cfg.Store = checkpoint.NewStore(checkpoint.OSFS{}, o.Run.CheckpointDir, o.Run.KeepCheckpoints).WithLog(o.Log).WithMode(checkpoint.DirMode(o.Run.CheckpointMode))
	}
	if co.Progress != nil {
		var lines progressLines
		cfg.OnProgress = func(p chief.Progress) {
			if s, ok := lines.next(p); ok {
				fmt.Fprintln(co.Progress, s)
			}
		}
	}
	c, err := chief.New(cfg)
	if err != nil {
		return nil, err
	}
	g := o.grpcServer(chiefMaxRecv, func(reason string) { m.RejectedRequests.WithLabelValues(reason).Inc() })
	pb.RegisterChiefServer(g, c)
	refusals := ratelog.New(o.Log, refusalLogEvery, nil)
	defer refusals.Flush(true)
	go g.Serve(o.limitListener(lis, refusals, nil))
	defer g.Stop()
	o.Log.Info("chief listening", "addr", addr, "run", co.RunID, "model", spec.String(), "mode", o.Run.Mode)

	rep, err := c.Run(ctx)
	if err != nil {
		return nil, err
	}
	rep.BLAS = blas.Describe()
	// Also after an interrupt: the run is over, the PS processes go.
	c.Shutdown(context.WithoutCancel(ctx))
	if co.ReportPath != "" {
		if err := rep.Write(co.ReportPath); err != nil {
			return rep, err
		}
	}
	return rep, nil
}
