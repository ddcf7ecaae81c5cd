package chief

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/report"
	"github.com/pstrain/pstrain/shardckpt"
	"github.com/pstrain/pstrain/wire"
)

// shardInit is what Init gives one shard.
type shardInit struct {
	params, opt []float32
	optSteps    int64
	version     int64
}

// freshInit is the run's initial state for every shard.
func (c *Chief) freshInit() []shardInit {
	init := c.cfg.Spec.Init(uint64(c.cfg.Run.Seed))
	out := make([]shardInit, len(c.cfg.PS))
	for s := range out {
		flat := make([]float32, c.plan.Shards[s].Size)
		c.plan.Gather(s, init, flat)
		out[s] = shardInit{params: flat}
	}
	return out
}

// restored is a checkpoint loaded for this run's plan.
type restored struct {
	step   int64
	path   string
	final  bool // written when training ended
	shards []shardInit
}

// loadLatest reads the newest checkpoint that verifies, skipping (and
// logging) damaged newer ones. It returns nil if there is none.
func (c *Chief) loadLatest() (*restored, error) {
	if c.cfg.Store == nil {
		return nil, nil
	}
	info, skipped, err := c.cfg.Store.Latest()
	for _, sk := range skipped {
		c.cfg.Log.Warn("skipping a damaged checkpoint", "path", sk.Path, "err", sk.Err)
	}
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ck, err := c.cfg.Store.Load(info.Path)
	if err != nil {
		return nil, err
	}
	st, err := shardckpt.Read(ck, c.cfg.Spec, c.cfg.Run.Optimizer)
	if err != nil {
		return nil, err
	}
	r := &restored{step: info.Step, path: info.Path, final: ck.Manifest.Final}
	for s := range c.cfg.PS {
		p, o := st.Shard(c.plan, s)
		r.shards = append(r.shards, shardInit{params: p, opt: o, optSteps: st.OptimizerSteps, version: ck.Manifest.Version})
	}
	return r, nil
}

// archiveOld moves the complete checkpoints in the store's directory into
// DIR/archive-<time>/ so that a new run never mixes its checkpoints with
// another run's. Nothing is deleted.
func (c *Chief) archiveOld() error {
	if c.cfg.Store == nil {
		return nil
	}
	infos, err := c.cfg.Store.List()
	if err != nil || len(infos) == 0 {
		return err
	}
	dir := filepath.Join(c.cfg.Store.Dir(), "archive-"+c.cfg.Now().UTC().Format("20060102T150405.000"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, in := range infos {
		if err := os.Rename(in.Path, filepath.Join(dir, filepath.Base(in.Path))); err != nil {
			return err
		}
	}
	c.cfg.Log.Warn("starting a new run: moved the previous checkpoints aside", "count", len(infos), "to", dir)
	return nil
}

// initShard sends shard s its state in generation gen.
func (c *Chief) initShard(ctx context.Context, s int, in shardInit, gen, maxSteps int64) error {
	r := c.cfg.Run
	req := &pb.InitRequest{RunId: c.cfg.RunID, Shard: int32(s), NumShards: int32(r.PS), RunConfig: r.JSON(),
		Params: wire.Bytes(in.params), Version: in.version, MaxVersion: maxSteps, LiveWorkers: c.liveWorkers(),
		Generation: gen, ModelSpec: c.cfg.Spec.JSON(), OptimizerStep: in.optSteps}
	if len(in.opt) > 0 {
		req.OptimizerState = wire.Bytes(in.opt)
	}
	p := c.cfg.PS[s]
	return c.callPS(ctx, s, "init", func(ctx context.Context) error { _, err := p.Client.Init(ctx, req); return err })
}

// checkpointResult is the outcome of one checkpoint attempt.
type checkpointResult struct {
	step     int64
	bytes    int64
	pause    time.Duration // the longest lock hold among the shards
	duration time.Duration
	skipped  string // why nothing was written, if so
	err      error
}

// writeCheckpoint has every shard snapshot and write its slice, then
// commits the manifest. In sync mode every shard snapshots the same
// version, `ahead` versions past the newest one seen, so that no shard has
// passed it when the request arrives; a shard that has passed it anyway
// fails the attempt and the caller retries with a larger margin. In
// async/ssp mode each shard snapshots at once and the manifest records
// each shard's own version (see docs/recovery.md).
func (c *Chief) writeCheckpoint(ctx context.Context, versions []int64, ahead int64, final bool) checkpointResult {
	t0 := c.cfg.Now()
	r := c.cfg.Run
	var at, step int64
	hi := int64(0)
	for _, v := range versions {
		hi = max(hi, v)
	}
	step = hi
	if r.Mode == config.Sync && !final {
		// Not past the last step: a shard that stops there would never
		// reach the version (the final checkpoint covers the end).
		if hi >= c.maxSteps {
			return checkpointResult{step: hi, skipped: "training is at its last step"}
		}
		at = min(hi+ahead, c.maxSteps)
		step = at
	}
	c.mu.Lock()
	latest := c.latestCkpt
	c.mu.Unlock()
	if step <= latest {
		return checkpointResult{step: step, skipped: fmt.Sprintf("a checkpoint at step %d exists", latest)}
	}
	infos := make([]checkpoint.ShardInfo, len(c.cfg.PS))
	pauses := make([]time.Duration, len(c.cfg.PS))
	errs := make([]error, len(c.cfg.PS))
	var wg sync.WaitGroup
	for s, p := range c.cfg.PS {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			resp, err := p.Client.Checkpoint(cctx, &pb.CheckpointRequest{Step: step, AtVersion: at, RunId: c.cfg.RunID})
			if err != nil {
				errs[s] = fmt.Errorf("ps/%d: %s", s, status.Convert(err).Message())
				if status.Code(err) == codes.FailedPrecondition {
					errs[s] = fmt.Errorf("%w: %w", errTooLate, errs[s])
				}
				return
			}
			infos[s] = checkpoint.ShardInfo{Index: s, File: resp.File, SHA256: resp.Sha256, Bytes: resp.Bytes,
				Tensors: resp.Tensors, Version: resp.Version}
			pauses[s] = time.Duration(resp.PauseSeconds * float64(time.Second))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return checkpointResult{step: step, err: err}
	}
	res := checkpointResult{step: step}
	version := infos[0].Version
	for s, in := range infos {
		res.bytes += in.Bytes
		res.pause = max(res.pause, pauses[s])
		version = min(version, in.Version)
	}
	m := checkpoint.Manifest{Step: step, Version: version, Mode: string(r.Mode), ModelSpec: c.cfg.Spec.JSON(),
		RunConfig: r.JSON(), Optimizer: checkpoint.Optimizer{Name: r.Optimizer,
			Hyperparams: map[string]float64{"lr": r.LR, "momentum": r.Momentum}}, Shards: infos, Final: final}
	if err := c.cfg.Store.Commit(m); err != nil && !errors.Is(err, checkpoint.ErrRetention) {
		res.err = err
		return res
	} else if err != nil {
		c.cfg.Log.Warn("checkpoint committed, but deleting old ones failed", "err", err)
	}
	res.duration = c.cfg.Now().Sub(t0)
	c.mu.Lock()
	c.latestCkpt = step
	c.mu.Unlock()
	return res
}

// errTooLate marks a sync checkpoint whose version a shard had passed.
var errTooLate = errors.New("shard passed the checkpoint version")

// checkpointNow writes a checkpoint, retrying a sync one whose version
// was overtaken with a doubled margin.
func (c *Chief) checkpointNow(ctx context.Context, versions func() []int64, final bool) checkpointResult {
	ahead := int64(2)
	for attempt := 0; ; attempt++ {
		res := c.writeCheckpoint(ctx, versions(), ahead, final)
		if res.err == nil || !errors.Is(res.err, errTooLate) || attempt == 3 || ctx.Err() != nil {
			return res
		}
		ahead *= 4
	}
}

// recordCheckpoint updates the metrics and the log after an attempt.
func (c *Chief) recordCheckpoint(res checkpointResult) {
	switch {
	case res.err != nil:
		c.cfg.Log.Error("checkpoint failed; training goes on", "step", res.step, "err", res.err)
	case res.skipped != "":
		c.cfg.Log.Info("checkpoint skipped", "step", res.step, "why", res.skipped)
	default:
		c.cfg.Metrics.CheckpointDuration.Observe(res.duration.Seconds())
		c.cfg.Metrics.CheckpointSize.Set(float64(res.bytes))
		c.cfg.Metrics.CheckpointLastSuccess.Set(float64(c.cfg.Now().UnixNano()) / 1e9)
		c.cfg.Log.Info("checkpoint committed", "step", res.step, "bytes", res.bytes,
			"seconds", fmt.Sprintf("%.3f", res.duration.Seconds()), "max_pause", res.pause.Round(time.Microsecond))
	}
}

// chiefState is what a restarted chief needs to go on with the report:
// written after every evaluation, checkpoint and recovery.
type chiefState struct {
	RunID               string           `json:"run_id"`
	TrainStartedUnix    float64          `json:"train_started_unix"`
	Evals               []report.Eval    `json:"evals"`
	Restarts            []report.Restart `json:"restarts"`
	TimeToTargetSeconds *float64         `json:"time_to_target_seconds"`
	TestSeconds         float64          `json:"test_seconds"`
	Generation          int64            `json:"generation"`
	LatestCheckpoint    int64            `json:"latest_checkpoint"`
}

func (c *Chief) saveState(st chiefState) {
	if c.cfg.StatePath == "" {
		return
	}
	b, _ := json.Marshal(st)
	tmp := c.cfg.StatePath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err == nil {
		err = os.Rename(tmp, c.cfg.StatePath)
		if err == nil {
			return
		}
	}
	c.cfg.Log.Warn("could not save the chief state; a restarted chief will lose the report's history", "path", c.cfg.StatePath)
}

func (c *Chief) loadState() (chiefState, bool) {
	var st chiefState
	if c.cfg.StatePath == "" {
		return st, false
	}
	b, err := os.ReadFile(c.cfg.StatePath)
	if err != nil || json.Unmarshal(b, &st) != nil || st.RunID != c.cfg.RunID {
		return chiefState{}, false
	}
	return st, true
}
