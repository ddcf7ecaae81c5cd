package task

import (
	"context"
	"errors"
	"math"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/worker"
)

// RunWorker trains on the worker's data shard until training is done.
func RunWorker(ctx context.Context, o Options, blasThreads int) error {
	if err := o.prepare(); err != nil {
		return err
	}
	if err := blas.Setup(blasThreads); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The training set's shape and labels; the images of the worker's
	// shard are read once the chief has said which shard that is.
	train, err := dataset.OpenTrainSet(o.Run.DataDir, o.Run.Dataset)
	if err != nil {
		return err
	}
	spec := o.Run.Spec(train.Dim, train.Classes)
	plan, err := partition.New(spec, len(o.Cluster.PS))
	if err != nil {
		return err
	}
	reg := o.registry()
	m := metrics.NewWorker(reg)
	stopMetrics, err := o.serveMetrics(ctx, reg)
	if err != nil {
		return err
	}
	defer stopMetrics()

	conn, err := o.dial(o.Cluster.Chief[0])
	if err != nil {
		return err
	}
	defer conn.Close()
	chief := pb.NewChiefClient(conn)
	addr, _ := o.Cluster.Addr(o.Task)
	reg0, err := o.register(ctx, chief, &spec, addr)
	if err != nil {
		return err
	}
	// Only the shard's images, as stored (a byte per pixel), converted a
	// batch at a time into the net's input. The shards are those the
	// chief's data plan gives this index, era by era (docs/elastic.md: a
	// run's worker count may change at an epoch boundary); a process
	// registers once, and a restarted worker reads its shards anew.
	// Full batches only (the short one at the end of an epoch is
	// skipped, like drop_remainder), so every step has exactly Batch
	// samples and the graph keeps one shape; the worker seeks them to its
	// data position.
	dplan, err := registrationPlan(reg0, o.Run)
	if err != nil {
		return err
	}
	var held int
	load := func(index, count int) (dataset.Samples, error) {
		sh, err := train.Shard(dataset.ShardSpec{Index: index, Count: count, Fraction: o.Run.DataFraction, Seed: o.Run.Seed})
		if err != nil {
			return nil, err
		}
		held += sh.HeldBytes()
		o.Log.Info("data shard loaded", "worker", index, "of", count, "samples", sh.N, "data_mib", math.Round(float64(sh.HeldBytes())/(1<<20)*10)/10)
		return sh, nil
	}
	batches, err := dataset.NewElasticBatches(o.Task.Index, o.Run.Seed, dplan, load)
	if err != nil {
		return err
	}
	o.Log.Info("worker registered", "run", reg0.RunId, "workers", dplan.Last().Workers, "data_mib", math.Round(float64(held)/(1<<20)*10)/10, "blas", blas.Describe())

	var shards []worker.Shard
	for i, a := range o.Cluster.PS {
		dp, pdp, gc, closeDP, err := o.shardClients(a)
		if err != nil {
			return err
		}
		defer closeDP()
		if len(o.Cluster.Standby) > 0 {
			// A hot standby: the shard's client switches to the other
			// process when the one it talks to refuses, or stays silent
			// while the other serves as primary (docs/replication.md).
			sa := o.Cluster.Standby[i]
			sdp, spdp, sgc, closeSDP, err := o.shardClients(sa)
			if err != nil {
				return err
			}
			defer closeSDP()
			dp, pdp = worker.NewFailoverPair(i,
				worker.Process{Task: cluster.Task{Type: cluster.PS, Index: i}.String(), Addr: a, Client: dp, Role: roleOf(gc)},
				worker.Process{Task: cluster.Task{Type: cluster.Standby, Index: i}.String(), Addr: sa, Client: sdp, Role: roleOf(sgc)},
				pdp, spdp, o.Log)
		}
		shards = append(shards, worker.Shard{Addr: a, Client: dp, Puller: pdp})
	}
	net, err := nn.New(spec, o.Run.Batch, true)
	if err != nil {
		return err
	}
	defer net.Close()
	w, err := worker.New(worker.Config{Index: o.Task.Index, RunID: reg0.RunId, Run: o.Run, Plan: plan, Net: net,
		Shards: shards, Batches: batches, DataPlan: batches, Log: o.Log, Metrics: m,
		RetryTimeout: o.ConnectTimeout, Faults: o.GradientFaults})
	if err != nil {
		return err
	}

	// Heartbeats, owned by this function.
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		w.Heartbeats(ctx, chief, o.Run.HeartbeatTimeout)
	}()
	err = w.Run(ctx)
	cancel()
	<-hbDone
	return err
}

// shardClients are a worker's clients of the PS process at addr
// (WorkerClients) and its gRPC client (gc) for everything else; close
// closes them all.
func (o Options) shardClients(addr string) (push, pull worker.DataPlane, gc pb.ParameterServerClient, close func(), err error) {
	c, err := o.dial(addr)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	gc = pb.NewParameterServerClient(c)
	push, pull, closeDP := WorkerClients(gc, o.Run.DataPlane == config.TCP, o.dataPlaneDeps())
	return push, pull, gc, func() { closeDP(); c.Close() }, nil
}

// roleOf asks the PS behind gc its replication role (worker.Process.Role).
func roleOf(gc pb.ParameterServerClient) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		st, err := gc.Status(ctx, &pb.StatusRequest{})
		return st.GetRole(), err
	}
}

// registrationPlan is the data plan the chief's registration answer
// carries; a chief without one (older) gives the fixed split of the
// run's --workers.
func registrationPlan(reg *pb.RegisterResponse, r config.Run) (dataset.DataPlan, error) {
	if reg.DataPlan == nil {
		return dataset.NewDataPlan(0, r.Batch, int(reg.NumDataShards)), errors.New("the chief sent no data plan (an older pstrain?)")
	}
	return convert.Plan(reg.DataPlan)
}
