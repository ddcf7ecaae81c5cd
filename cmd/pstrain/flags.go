package main

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/model"
)

// hiddenFlag parses --hidden 256,128. set, if not nil, records that the
// flag was given.
type hiddenFlag struct {
	v   *[]int
	set *bool
}

func (h hiddenFlag) String() string { return sizesText(h.v) }

func (h hiddenFlag) Set(s string) error {
	v, err := model.ParseHidden(s)
	if err != nil {
		return err
	}
	*h.v = v
	if h.set != nil {
		*h.set = true
	}
	return nil
}

func sizesText(v *[]int) string {
	if v == nil {
		return ""
	}
	var s []string
	for _, n := range *v {
		s = append(s, strconv.Itoa(n))
	}
	return strings.Join(s, ",")
}

// modelFlags are --model, --conv and --hidden together (and, on the
// commands that take them, --batch, --lr and --warmup-steps): choosing a model
// gives it its defaults for the flags not given, in any order, so `--model
// cnn` alone trains the default CNN at its learning rate and `--model cnn
// --hidden 512` keeps its 512.
type modelFlags struct {
	r                                              *config.Run
	hiddenSet, convSet, batchSet, lrSet, warmupSet bool
	// A CTR model's flags, and --dataset (whose default follows the
	// model: mnist, or synth-ctr for --model ctr).
	embDimSet, embOptSet, embLRSet, datasetSet, epochsSet, patienceSet bool
}

// setFlag wraps a flag's Value to record that it was given.
type setFlag struct {
	flag.Value
	set *bool
}

func (f setFlag) String() string {
	if f.Value == nil {
		return "" // the zero Value, which flag's help compares the default with
	}
	return f.Value.String()
}

func (f setFlag) Set(s string) error {
	*f.set = true
	return f.Value.Set(s)
}

// track records in *set whether fs's flag name is given.
func track(fs *flag.FlagSet, name string, set *bool) {
	fl := fs.Lookup(name)
	fl.Value = setFlag{fl.Value, set}
}

type modelFlag struct{ m *modelFlags }

func (f modelFlag) String() string {
	if f.m == nil {
		return "" // the zero Value, which flag's help compares the default with
	}
	return f.m.r.Model.String()
}

func (f modelFlag) Set(s string) error {
	d := config.Default()
	switch s {
	case model.KindMLP:
		f.m.apply("", nil, d.Hidden, d.Batch, d.WarmupSteps)
	case model.KindCNN:
		f.m.apply(model.KindCNN, config.DefaultCNNConv, config.DefaultCNNHidden, config.DefaultCNNBatch, config.DefaultCNNWarmupSteps)
	case model.KindCTR:
		f.m.apply(model.KindCTR, nil, config.DefaultCTRHidden, d.Batch, d.WarmupSteps)
	default:
		return fmt.Errorf("must be mlp, cnn or ctr, got %q", s)
	}
	f.m.applyCTR()
	return nil
}

// applyCTR sets, for the flags not given, a CTR model's embedding
// defaults and data set, or clears them for another model.
func (m *modelFlags) applyCTR() {
	r, ctr := m.r, m.r.Model.IsCTR()
	set := func(given bool, apply func()) {
		if !given {
			apply()
		}
	}
	set(m.embDimSet, func() { r.EmbeddingDim = pick(ctr, config.DefaultEmbeddingDim, 0) })
	set(m.embOptSet, func() { r.EmbeddingOptimizer = pick(ctr, config.DefaultEmbeddingOptimizer, "") })
	set(m.embLRSet, func() { r.EmbeddingLR = pick(ctr, config.DefaultEmbeddingLR, 0) })
	set(m.datasetSet, func() { r.Dataset = pick(ctr, ctrdata.SynthName, config.Default().Dataset) })
	set(m.epochsSet, func() { r.Epochs = pick(ctr, config.DefaultCTREpochs, config.Default().Epochs) })
	set(m.patienceSet, func() { r.Patience = pick(ctr, config.DefaultCTRPatience, config.Default().Patience) })
}

// pick is a if cond, else b.
func pick[T any](cond bool, a, b T) T {
	if cond {
		return a
	}
	return b
}

// apply sets the model kind and, for the flags not given, its defaults.
func (m *modelFlags) apply(kind config.ModelKind, conv, hidden []int, batch int, warmup int64) {
	r := m.r
	r.Model = kind
	if !m.convSet {
		r.Conv = slices.Clone(conv)
	}
	if !m.hiddenSet {
		r.Hidden = slices.Clone(hidden)
	}
	if !m.batchSet {
		r.Batch = batch
	}
	if !m.warmupSet {
		r.WarmupSteps = warmup
	}
	m.defaultLR()
}

// defaultLR sets the learning rate, unless --lr was given, to the
// default for the model, mode and workers so far (config.DefaultLR).
// A command calls it once the run's mode and workers are final (after
// parsing, or after the cluster file's counts); --model calls it too.
func (m *modelFlags) defaultLR() {
	if !m.lrSet {
		m.r.LR = config.DefaultLR(m.r.Model, m.r.Mode, m.r.Workers)
	}
}

type convFlag struct{ m *modelFlags }

func (f convFlag) String() string {
	if f.m == nil {
		return ""
	}
	return sizesText(&f.m.r.Conv)
}

func (f convFlag) Set(s string) error {
	v, err := model.ParseConv(s)
	if err != nil {
		return err
	}
	f.m.r.Conv, f.m.convSet = v, true
	return nil
}

// bindRunFlags registers the run configuration flags on fs, with the
// defaults already in r. The command calls the returned modelFlags'
// defaultLR once --mode and --workers are final.
func bindRunFlags(fs *flag.FlagSet, r *config.Run) *modelFlags {
	fs.StringVar((*string)(&r.Mode), "mode", string(r.Mode), "SGD mode: sync, async or ssp")
	fs.IntVar(&r.Staleness, "staleness", r.Staleness, "ssp: how many steps a worker may run ahead of the slowest live worker")
	fs.StringVar((*string)(&r.DataSplit), "data-split", string(r.DataSplit), "async and ssp: how the workers get their data: queue (each epoch's batches handed out a few at a time as the workers read, so a slower worker reads less of every epoch) or fixed (a shard per worker, as in sync runs; docs/elastic.md)")
	fs.IntVar(&r.ReplicasToAggregate, "replicas-to-aggregate", r.ReplicasToAggregate, "sync: gradients per step (0 = all workers; fewer makes the rest backup workers)")
	fs.IntVar(&r.PS, "ps", r.PS, "number of parameter-server shards")
	fs.IntVar(&r.PSReplicas, "ps-replicas", r.PSReplicas, "hot standbys per PS shard: 0, or 1 (a standby/N process beside every ps/N takes over when its primary dies; docs/replication.md)")
	fs.IntVar(&r.Workers, "workers", r.Workers, "number of workers")
	fs.IntVar(&r.MaxWorkers, "max-workers", r.MaxWorkers, "most workers the run may scale to with pstrain scale or a worker registering with the next index (0 = 8, or --workers if more; docs/elastic.md)")
	fs.IntVar(&r.MaxPS, "max-ps", r.MaxPS, "most parameter servers the run may scale to with pstrain scale --ps (0 = --ps: no room to grow; docs/elastic.md)")
	m := bindModelFlags(fs, r)
	fs.Int64Var(&r.EmbeddingPrefill, "embedding-prefill", r.EmbeddingPrefill, "ctr: rows each embedding table starts with, of keys no data uses (2^62 and up), spread over the PS like any row: tables of a given size (e.g. for memory or speed tests) that train as the data alone trains them; a run restored from a checkpoint has the checkpoint's rows (0 = none)")
	fs.IntVar(&r.Batch, "batch", r.Batch, "per-worker batch size (--model cnn: "+strconv.Itoa(config.DefaultCNNBatch)+" unless given)")
	fs.Float64Var(&r.LR, "lr", r.LR, "learning rate (unless given: "+lrDefaults()+")")
	fs.Float64Var(&r.Momentum, "momentum", r.Momentum, "momentum (optimizer momentum)")
	fs.StringVar(&r.Optimizer, "optimizer", r.Optimizer, "sgd, momentum or adam")
	fs.StringVar(&r.LRSchedule, "lr-schedule", r.LRSchedule, "learning rate over the global step: constant, step:EPOCHS:FACTOR (times FACTOR every EPOCHS epochs, e.g. step:2:0.5) or cosine (to 0 at the last step of --epochs); applied by the PS shards")
	fs.Int64Var(&r.WarmupSteps, "warmup-steps", r.WarmupSteps, "ramp the learning rate up linearly over this many first global steps (0 = no warmup; --model cnn: "+strconv.FormatInt(config.DefaultCNNWarmupSteps, 10)+" unless given)")
	fs.Float64Var(&r.Epochs, "epochs", r.Epochs, "epochs to train (an upper bound when --target-accuracy is set; --model ctr: "+strconv.FormatFloat(config.DefaultCTREpochs, 'g', -1, 64)+" unless given)")
	track(fs, "epochs", &m.epochsSet)
	fs.IntVar(&r.Patience, "patience", r.Patience, "stop once this many evaluations in a row score a test loss no lower than the best so far, and hand back the best model evaluated, from its checkpoint (without checkpoints: the model at the stop) (0 = never; --model ctr: "+strconv.Itoa(config.DefaultCTRPatience)+" unless given, as its tables overfit after a few epochs; docs/semantics.md)")
	track(fs, "patience", &m.patienceSet)
	fs.Float64Var(&r.TargetAccuracy, "target-accuracy", r.TargetAccuracy, "stop once the test accuracy holds at this (0 = run all epochs); the model handed back is one that scored it")
	fs.IntVar(&r.TargetHold, "target-hold", r.TargetHold, "evaluations in a row that must score --target-accuracy on the whole test set before the run stops")
	fs.StringVar(&r.Dataset, "dataset", r.Dataset, "data set: mnist, fashion-mnist, mnist-x4 (4x MNIST: shifted and rotated copies), or idx:TRAIN_IMAGES,TRAIN_LABELS,TEST_IMAGES,TEST_LABELS; for --model ctr: synth-ctr (the default; pstrain data synth-ctr writes it), criteo:PATH (its last tenth held out) or criteo:TRAIN,TEST")
	fs.StringVar(&r.DataDir, "data-dir", r.DataDir, "directory holding the data sets")
	fs.Float64Var(&r.DataFraction, "data-fraction", r.DataFraction, "fraction of the training set to use, in (0, 1]")
	fs.Int64Var(&r.Seed, "seed", r.Seed, "seed for initial weights and data order")
	fs.StringVar((*string)(&r.DataPlane), "data-plane", string(r.DataPlane), "how workers pull and push: grpc, or tcp (raw float32 frames beside the gRPC API; faster)")
	fs.StringVar((*string)(&r.WireDType), "wire-dtype", string(r.WireDType), "how workers send gradients: f32, or bf16 (half the bytes, 8 significant bits)")
	fs.StringVar((*string)(&r.DataPlanePrivacy), "data-plane-privacy", string(r.DataPlanePrivacy), "with --tls-dir, what the TCP data plane between hosts does for its bytes: encrypt (TLS on every byte), or integrity (the TLS handshake authenticates both ends, then every record goes in the clear with a MAC bound to the connection: faster, but anyone on the path reads the model and the gradients; docs/security.md)")
	fs.StringVar(&r.Compress, "compress", r.Compress, "compress pushes and pulls, keeping what is not sent for later (error feedback): none, topk:FRACTION (the largest FRACTION of the values, e.g. topk:0.01), int8 (a byte per value) or sign (a bit per value) for both directions, or PUSH/PULL, a codec for each (e.g. topk:0.01/int8); docs/wire.md")
	fs.StringVar((*string)(&r.NaNPolicy), "nan-policy", string(r.NaNPolicy), "a gradient with NaN/Inf: reject (the worker stops with an error) or skip (dropped, training goes on; sync counts it for the step, left out of the mean); never applied")
	fs.Float64Var(&r.NormGuard, "norm-guard", r.NormGuard, "refuse a gradient whose norm is more than this many times the median of the shard's last 32 accepted norms (0 = off; docs/security.md)")
	fs.StringVar((*string)(&r.Aggregate), "aggregate", string(r.Aggregate), "sync: how a step combines its gradients: mean, or trimmed-mean (per coordinate, without the largest and smallest value; 3 or more gradients)")
	fs.DurationVar(&r.EvalEvery, "eval-every", r.EvalEvery, "chief: evaluate on the test set this often (0 = only at the end)")
	fs.DurationVar(&r.HeartbeatTimeout, "heartbeat-timeout", r.HeartbeatTimeout, "a worker silent this long is considered dead")
	fs.StringVar(&r.CheckpointDir, "checkpoint-dir", r.CheckpointDir, "where checkpoints go, shared by the chief and every PS (\"\" = no checkpoints)")
	fs.TextVar(&r.CheckpointEvery, "checkpoint-every", r.CheckpointEvery, "checkpoint interval: a duration (30s) or global steps (500); 0 = only at the end")
	fs.IntVar(&r.KeepCheckpoints, "keep-checkpoints", r.KeepCheckpoints, "how many checkpoints to keep (0 = all)")
	fs.TextVar(&r.CheckpointMode, "checkpoint-mode", r.CheckpointMode, "permission of the checkpoint directories in octal; files get the same without execute bits (0750: directories 0750, files 0640; default private to the run's user)")
	fs.IntVar(&r.KeepArchives, "keep-archives", r.KeepArchives, "chief: how many archive-TIME directories of earlier runs' checkpoints to keep in --checkpoint-dir; older ones are deleted when a new run starts (0 = none, -1 = all)")
	fs.BoolVar(&r.Resume, "resume", r.Resume, "start from the newest valid checkpoint in --checkpoint-dir, if any; with checkpoints there but every one damaged, refuse to start (false: start afresh, moving old checkpoints aside)")
	track(fs, "batch", &m.batchSet)
	track(fs, "lr", &m.lrSet)
	track(fs, "warmup-steps", &m.warmupSet)
	track(fs, "dataset", &m.datasetSet)
	return m
}

// lrDefaults describes config.DefaultLR for --lr's help.
func lrDefaults() string {
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return g(config.DefaultMLPLR) + " for an MLP in sync, divided by --workers in async and ssp; " + g(config.DefaultCNNLR) + " for --model cnn and " + g(config.DefaultCTRLR) + " for --model ctr's dense layers, divided the same way"
}

// bindModelFlags registers --model, --conv and --hidden on fs.
func bindModelFlags(fs *flag.FlagSet, r *config.Run) *modelFlags {
	m := &modelFlags{r: r}
	fs.Var(modelFlag{m}, "model", "network: mlp, cnn (LeNet-style: per --conv entry a 5x5 convolution, ReLU and 2x2 max-pool, then the --hidden dense layers), or ctr (click-through rate: a sample's categorical keys look up embedding rows, concatenated with its dense features into the --hidden layers and one logit; docs/models.md)")
	fs.Var(convFlag{m}, "conv", "cnn: comma list of each convolution's output channels (--model cnn: "+sizesText(&config.DefaultCNNConv)+" unless given)")
	fs.Var(hiddenFlag{&r.Hidden, &m.hiddenSet}, "hidden", "comma list of hidden (dense) layer sizes (--model cnn: "+sizesText(&config.DefaultCNNHidden)+", --model ctr: "+sizesText(&config.DefaultCTRHidden)+" unless given)")
	fs.IntVar(&r.EmbeddingDim, "embedding-dim", r.EmbeddingDim, "ctr: values per embedding row (--model ctr: "+strconv.Itoa(config.DefaultEmbeddingDim)+" unless given)")
	fs.StringVar(&r.EmbeddingOptimizer, "embedding-optimizer", r.EmbeddingOptimizer, "ctr: how embedding rows train: adagrad, sgd or momentum (--model ctr: "+config.DefaultEmbeddingOptimizer+" unless given)")
	fs.Float64Var(&r.EmbeddingLR, "embedding-lr", r.EmbeddingLR, "ctr: the embedding rows' learning rate (--model ctr: "+strconv.FormatFloat(config.DefaultEmbeddingLR, 'g', -1, 64)+" unless given)")
	track(fs, "embedding-dim", &m.embDimSet)
	track(fs, "embedding-optimizer", &m.embOptSet)
	track(fs, "embedding-lr", &m.embLRSet)
	return m
}

// lrText describes the learning rate for a header line: "0.2", or with a
// schedule "0.2 (step:2:0.3, warmup 50)".
func lrText(r config.Run) string {
	s := strconv.FormatFloat(r.LR, 'g', -1, 64)
	var extra []string
	if r.LRSchedule != "" && r.LRSchedule != "constant" {
		extra = append(extra, r.LRSchedule)
	}
	if r.WarmupSteps > 0 {
		extra = append(extra, fmt.Sprintf("warmup %d", r.WarmupSteps))
	}
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	return s
}

// runArgs renders r as the flags bindRunFlags reads, for child processes.
func runArgs(r config.Run) []string {
	args := []string{
		"--mode=" + string(r.Mode),
		fmt.Sprintf("--staleness=%d", r.Staleness),
		"--data-split=" + string(r.DataSplit),
		fmt.Sprintf("--replicas-to-aggregate=%d", r.ReplicasToAggregate),
		fmt.Sprintf("--ps=%d", r.PS),
		fmt.Sprintf("--ps-replicas=%d", r.PSReplicas),
		fmt.Sprintf("--workers=%d", r.Workers),
		fmt.Sprintf("--max-workers=%d", r.MaxWorkers),
		fmt.Sprintf("--max-ps=%d", r.MaxPS),
		"--model=" + r.Model.String(),
		"--conv=" + sizesText(&r.Conv),
		"--hidden=" + sizesText(&r.Hidden),
		fmt.Sprintf("--batch=%d", r.Batch),
		"--lr=" + strconv.FormatFloat(r.LR, 'g', -1, 64),
		"--momentum=" + strconv.FormatFloat(r.Momentum, 'g', -1, 64),
		"--optimizer=" + r.Optimizer,
		"--lr-schedule=" + r.LRSchedule,
		fmt.Sprintf("--warmup-steps=%d", r.WarmupSteps),
		"--epochs=" + strconv.FormatFloat(r.Epochs, 'g', -1, 64),
		"--target-accuracy=" + strconv.FormatFloat(r.TargetAccuracy, 'g', -1, 64),
		fmt.Sprintf("--target-hold=%d", r.TargetHold),
		fmt.Sprintf("--patience=%d", r.Patience),
		"--dataset=" + r.Dataset,
		"--data-dir=" + r.DataDir,
		"--data-fraction=" + strconv.FormatFloat(r.DataFraction, 'g', -1, 64),
		fmt.Sprintf("--seed=%d", r.Seed),
		"--nan-policy=" + string(r.NaNPolicy),
		"--norm-guard=" + strconv.FormatFloat(r.NormGuard, 'g', -1, 64),
		"--aggregate=" + string(r.Aggregate),
		"--data-plane=" + string(r.DataPlane),
		"--wire-dtype=" + string(r.WireDType),
		"--data-plane-privacy=" + string(r.DataPlanePrivacy),
		"--compress=" + r.Compress,
		"--eval-every=" + r.EvalEvery.String(),
		"--heartbeat-timeout=" + r.HeartbeatTimeout.String(),
		"--checkpoint-dir=" + r.CheckpointDir,
		"--checkpoint-every=" + r.CheckpointEvery.String(),
		fmt.Sprintf("--keep-checkpoints=%d", r.KeepCheckpoints),
		"--checkpoint-mode=" + r.CheckpointMode.String(),
		fmt.Sprintf("--keep-archives=%d", r.KeepArchives),
		fmt.Sprintf("--resume=%t", r.Resume),
	}
	if r.Model.IsCTR() { // the tables' flags: other models refuse them
		args = append(args,
			fmt.Sprintf("--embedding-dim=%d", r.EmbeddingDim),
			"--embedding-optimizer="+r.EmbeddingOptimizer,
			"--embedding-lr="+strconv.FormatFloat(r.EmbeddingLR, 'g', -1, 64))
		if r.EmbeddingPrefill != 0 {
			args = append(args, fmt.Sprintf("--embedding-prefill=%d", r.EmbeddingPrefill))
		}
	}
	return args
}

// bindWebConfigFlag adds --web.config.file, under the name Prometheus
// exporters share (node_exporter's), for the metrics endpoint; more is
// appended to its usage.
func bindWebConfigFlag(fs *flag.FlagSet, more string) *string {
	return fs.String("web.config.file", "", "serve /metrics and /healthz with the Prometheus exporter web config file (TLS, basic auth; docs/observability.md)"+more)
}
