package task

import (
	"context"
	"errors"
	"math"
	"sync"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/rowclient"
	"github.com/pstrain/pstrain/worker"
)

// WorkerDeps are what a worker takes from outside: the network, the
// model, its data, its metrics.
type WorkerDeps struct {
	// Network's Dialer reaches the chief and the PS processes (a worker
	// serves nothing: no Listener).
	Network
	Spec model.Spec
	// Load reads data shard index of count (dataset.ShardLoader); the
	// worker loads those of the chief's data plan.
	Load dataset.ShardLoader
	// Batches, if set, is the worker's batch source instead of Load's
	// shards (tests: batches of their own), given the data shard the
	// chief assigns.
	Batches func(dataShard, numShards int) worker.BatchSource
	// RunID is the run's id when the cluster has no chief to tell it
	// (in-process clusters without one; Batches is then required).
	RunID string
	// Metrics are the worker's metrics (nil: not recorded).
	Metrics *metrics.Worker
	Builds  Builds
	// Tweak, if set, has the last word on the worker's configuration
	// (tests: hooks, retry patience).
	Tweak func(*worker.Config)
}

// Worker is the worker task: worker.Worker over a connection to every
// shard, registered with the chief. NewWorker builds it, Run trains;
// Close closes its connections and net.
type Worker struct {
	o       Options
	w       *worker.Worker
	reg     *pb.RegisterResponse // nil without a chief
	chief   pb.ChiefClient       // nil without a chief
	closers closers
	// For a change of the PS count (psswitch.go): the model, the
	// configuration the worker was built with, the connections to the
	// PS slots dialled so far (by slot), and the layout followed; a CTR
	// worker's net and its row connections to every PS slot (ctr.go).
	spec     model.Spec
	cfg      worker.Config
	conns    []worker.Shard
	layout   *layoutSwitch
	ctr      *worker.CTRNet
	rowConns []rowclient.Shard
}

// NewWorker registers the worker with the chief (retrying until it
// answers, up to ConnectTimeout), reads its data shards, connects to
// every shard and builds its net. Without a chief in o.Cluster the
// worker takes a session of its own and trains on d.Batches. On error it
// closes what it opened.
func NewWorker(ctx context.Context, o Options, d WorkerDeps) (_ *Worker, err error) {
	if err := o.prepare(d.Network); err != nil {
		return nil, err
	}
	w := &Worker{o: o, spec: d.Spec}
	defer func() {
		if err != nil {
			w.closers.closeAll()
		}
	}()
	runID, batches, follower, err := w.register(ctx, d)
	if err != nil {
		return nil, err
	}
	layout := initialLayout(o, w.reg)
	plan, err := layout.Plan(d.Spec)
	if err != nil {
		return nil, err
	}
	shards, err := w.shardsFor(layout.PS)
	if err != nil {
		return nil, err
	}
	net, err := w.buildNet(d, runID, layout.PS)
	if err != nil {
		return nil, err
	}
	cfg := worker.Config{Index: o.Task.Index, RunID: runID, Run: o.Run, Plan: plan, Net: net,
		Shards: shards, Batches: batches, DataPlan: follower, Log: o.Log, Metrics: d.Metrics,
		RetryTimeout: o.ConnectTimeout, Faults: o.GradientFaults}
	if w.chief != nil {
		w.layout = &layoutSwitch{cur: layout}
		cfg.Layout = w.layout
	}
	if d.Tweak != nil {
		d.Tweak(&cfg)
	}
	if w.w, err = worker.New(cfg); err != nil {
		return nil, err
	}
	w.cfg = cfg
	return w, nil
}

// register registers with the chief and makes the worker's batches: the
// shards the chief's data plan gives this index, era by era
// (docs/elastic.md: a run's worker count may change at an epoch
// boundary); a process registers once, and a restarted worker reads its
// shards anew. Full batches only (the short one at the end of an epoch is
// skipped, like drop_remainder), so every step has exactly Batch samples
// and the graph keeps one shape; the worker seeks them to its data
// position.
func (w *Worker) register(ctx context.Context, d WorkerDeps) (string, worker.BatchSource, worker.PlanFollower, error) {
	o := w.o
	if len(o.Cluster.Chief) == 0 {
		return w.standalone(d)
	}
	conn, err := o.dial(o.Cluster.Chief[0])
	if err != nil {
		return "", nil, nil, err
	}
	w.closers.add(func() { conn.Close() })
	w.chief = pb.NewChiefClient(conn)
	addr, _ := o.Cluster.Addr(o.Task)
	if w.reg, err = o.register(ctx, w.chief, &d.Spec, addr); err != nil {
		return "", nil, nil, err
	}
	if d.Batches != nil {
		return w.reg.RunId, d.Batches(int(w.reg.DataShard), int(w.reg.NumDataShards)), nil, nil
	}
	dplan, err := registrationPlan(w.reg, o.Run)
	if err != nil {
		return "", nil, nil, err
	}
	held := 0
	batches, err := dataset.NewElasticBatches(o.Task.Index, o.Run.Seed, dplan, w.loader(d.Load, &held))
	if err != nil {
		return "", nil, nil, err
	}
	o.Log.Info("worker registered", "run", w.reg.RunId, "workers", dplan.Last().Workers, "data_mib", mib(held), "blas", blas.Describe())
	return w.reg.RunId, batches, batches, nil
}

// standalone is register without a chief: a session of the worker's own,
// and d.Batches on the fixed split of the run's --workers.
func (w *Worker) standalone(d WorkerDeps) (string, worker.BatchSource, worker.PlanFollower, error) {
	if d.Batches == nil {
		return "", nil, nil, errors.New("a worker without a chief needs batches of its own")
	}
	s, err := auth.NewSession()
	if err != nil {
		return "", nil, nil, err
	}
	w.o.creds.SetSession(s)
	return d.RunID, d.Batches(w.o.Task.Index, w.o.Run.Workers), nil, nil
}

// loader is load that logs each shard it reads and adds the bytes the
// shard holds (those of a dataset.TrainShard, which reads only the
// shard's images, as stored) to held.
func (w *Worker) loader(load dataset.ShardLoader, held *int) dataset.ShardLoader {
	return func(index, count int) (dataset.Samples, error) {
		sh, err := load(index, count)
		if err != nil {
			return nil, err
		}
		n, _ := sh.Shape()
		b := 0
		if h, ok := sh.(interface{ HeldBytes() int }); ok {
			b = h.HeldBytes()
		}
		*held += b
		w.o.Log.Info("data shard loaded", "worker", index, "of", count, "samples", n, "data_mib", mib(b))
		return sh, nil
	}
}

// mib is b in MiB, to a tenth.
func mib(b int) float64 { return math.Round(float64(b)/(1<<20)*10) / 10 }

// dialShards connects to every shard: to its PS process and, with hot
// standbys, to its standby too, the shard's client switching to the
// other process when the one it talks to refuses, or stays silent while
// the other serves as primary (docs/replication.md).
func (w *Worker) dialShards() ([]worker.Shard, error) {
	return w.dialSlots(0, len(w.o.Cluster.PS))
}

// dialSlots is dialShards for the PS slots [from, to).
func (w *Worker) dialSlots(from, to int) ([]worker.Shard, error) {
	o := w.o
	var shards []worker.Shard
	for i := from; i < to; i++ {
		a := o.Cluster.PS[i]
		dp, pdp, gc, err := w.shardClients(a)
		if err != nil {
			return nil, err
		}
		if len(o.Cluster.Standby) > 0 {
			sa := o.Cluster.Standby[i]
			sdp, spdp, sgc, err := w.shardClients(sa)
			if err != nil {
				return nil, err
			}
			dp, pdp = worker.NewFailoverPair(i,
				worker.Process{Task: cluster.Task{Type: cluster.PS, Index: i}.String(), Addr: a, Client: dp, Role: roleOf(gc)},
				worker.Process{Task: cluster.Task{Type: cluster.Standby, Index: i}.String(), Addr: sa, Client: sdp, Role: roleOf(sgc)},
				pdp, spdp, o.Log)
		}
		shards = append(shards, worker.Shard{Addr: a, Client: dp, Puller: pdp})
	}
	return shards, nil
}

// DialShards connects to every shard of o's cluster as NewWorker does,
// with a session of its own, for code that runs a worker.Worker of its
// own over the connections (bench, through testcluster.Cluster.Dial).
// close closes them.
func DialShards(o Options, n Network) (_ []worker.Shard, close func(), err error) {
	if err := o.prepare(n); err != nil {
		return nil, nil, err
	}
	s, err := auth.NewSession()
	if err != nil {
		return nil, nil, err
	}
	o.creds.SetSession(s)
	w := &Worker{o: o}
	shards, err := w.dialShards()
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	return shards, w.Close, nil
}

// shardClients are the worker's clients of the PS process at addr
// (workerClients) and its gRPC client (gc) for everything else; Close
// closes them.
func (w *Worker) shardClients(addr string) (push, pull worker.DataPlane, gc pb.ParameterServerClient, err error) {
	c, err := w.o.dial(addr)
	if err != nil {
		return nil, nil, nil, err
	}
	w.closers.add(func() { c.Close() })
	gc = pb.NewParameterServerClient(c)
	push, pull, closeDP := workerClients(gc, w.o.Run.DataPlane == config.TCP, w.o.dataPlaneDeps())
	w.closers.add(closeDP)
	return push, pull, gc, nil
}

// Worker is the worker.Worker the task runs.
func (w *Worker) Worker() *worker.Worker { return w.w }

// Registration is the chief's answer to the worker's registration (nil
// without a chief).
func (w *Worker) Registration() *pb.RegisterResponse { return w.reg }

// Run trains until training is done or ctx ends, sending the chief
// heartbeats meanwhile.
//
// When the chief asks for another PS count (docs/elastic.md,
// "Parameter servers"), the training loop stops (its pulls are held at
// the change's step boundary; async and ssp: once the pushes under way
// are answered), the worker is rebuilt on the new layout, and training
// goes on.
func (w *Worker) Run(ctx context.Context) error {
	if w.chief == nil {
		return w.w.Run(ctx)
	}
	defer closeOnDone(ctx, w.cfg.DataPlan)()
	// The heartbeat goroutines, owned by Run: one per layout, each
	// stopped when its layout's training loop ends (its last heartbeat
	// may still be under way when the next layout's loop starts).
	var beats sync.WaitGroup
	defer beats.Wait()
	for {
		to, err := w.runLayout(ctx, &beats)
		if to.PS == 0 {
			return err
		}
		if err := w.switchLayout(to); err != nil {
			return err
		}
	}
}

// closeOnDone closes plan's reading when ctx ends, if it is a
// worker.DataReader: a read waiting for the chief's next data plan (an
// async or ssp change's hold) is woken by a new plan or by Close only,
// and the heartbeats that would bring either end with ctx. (Not on a
// layout's context: the batches go on across a change of the PS count.)
// The function returned stops the watch.
func closeOnDone(ctx context.Context, plan worker.PlanFollower) (stop func()) {
	dr, ok := plan.(worker.DataReader)
	if !ok {
		return func() {}
	}
	unwatch := context.AfterFunc(ctx, dr.Close)
	return func() { unwatch() }
}

// runLayout trains on the current layout, sending heartbeats (a
// goroutine in beats), until training ends (n 0, with Run's error) or
// the chief asks for another layout (to).
func (w *Worker) runLayout(ctx context.Context, beats *sync.WaitGroup) (to partition.Layout, err error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.layout.arm(cancel)
	ww := w.w
	beats.Add(1)
	go func() {
		defer beats.Done()
		ww.Heartbeats(rctx, w.chief, w.o.Run.HeartbeatTimeout)
	}()
	err = ww.RunStoppable(ctx, rctx) // (a change of the PS count: the pushes under way are answered first)
	cancel()
	if to := w.layout.take(); to.PS > 0 && err != nil && ctx.Err() == nil {
		return to, nil
	}
	beats.Wait() // (the end of training: its last heartbeat carries the final counts)
	return partition.Layout{}, err
}

// Close closes the worker's connections and its net. Call it once Run
// has returned (or was never called).
func (w *Worker) Close() { w.closers.closeAll() }

// RunWorker is the worker process: it opens the training set, serves
// metrics and runs NewWorker's worker until training is done.
func RunWorker(ctx context.Context, o Options, blasThreads int) error {
	if err := o.prepare(Network{}); err != nil {
		return err
	}
	if err := blas.Setup(blasThreads); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	spec, load, closeData, err := trainData(o.Run)
	if err != nil {
		return err
	}
	defer closeData()
	reg := o.registry()
	m := metrics.NewWorker(reg)
	stopMetrics, err := o.serveMetrics(ctx, reg)
	if err != nil {
		return err
	}
	defer stopMetrics()
	w, err := NewWorker(ctx, o, WorkerDeps{Spec: spec, Load: load, Metrics: m})
	if err != nil {
		return err
	}
	defer w.Close()
	return w.Run(ctx)
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

// trainData is a worker process's model and training set: the set's
// shape and labels (for a CTR model, its schema) now, and the samples of
// the worker's shards once the chief has said which shards those are,
// only theirs. MNIST-like images stay as stored (a byte per pixel),
// converted a batch at a time into the net's input.
func trainData(r config.Run) (model.Spec, dataset.ShardLoader, func(), error) {
	if r.Model.IsCTR() {
		set, err := ctrdata.Open(r.DataDir, r.Dataset)
		if err != nil {
			return model.Spec{}, nil, nil, err
		}
		s := set.Train.Schema()
		return r.CTRSpec(s.Dense, s.Cat), ctrLoader(r, set.Train), func() { set.Close() }, nil
	}
	train, err := dataset.OpenTrainSet(r.DataDir, r.Dataset)
	if err != nil {
		return model.Spec{}, nil, nil, err
	}
	load := func(index, count int) (dataset.Samples, error) {
		return train.Shard(dataset.ShardSpec{Index: index, Count: count, Fraction: r.DataFraction, Seed: r.Seed})
	}
	return r.Spec(train.Dim, train.Classes), load, func() {}, nil
}
