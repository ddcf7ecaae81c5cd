package chief

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
)

// errTooLate marks a sync checkpoint whose version a shard had passed.
var errTooLate = errors.New("shard passed the checkpoint version")

// checkpointNow carries out a Checkpoint, retrying a sync one whose
// version was overtaken with a larger margin (from freshly polled
// versions).
func (c *Chief) checkpointNow(ctx context.Context, a Checkpoint) CheckpointResult {
	ahead := int64(2)
	versions := a.Versions
	for attempt := 0; ; attempt++ {
		res := c.writeCheckpoint(ctx, a, versions, ahead)
		res.Final, res.Retained = a.Final, a.Retained
		if res.Err == nil || !errors.Is(res.Err, errTooLate) || attempt == 3 || ctx.Err() != nil {
			return res
		}
		ahead *= 4
		for s, x := range c.pollShards(ctx) {
			if x.Err == nil {
				versions[s] = x.Version
			}
		}
	}
}

// checkpointAt picks a checkpoint's step (its directory) and the version
// every shard snapshots (0: now). In sync mode every shard snapshots the
// same version, `ahead` versions past the newest one seen, so that no
// shard has passed it when the request arrives; a shard that has passed
// it anyway fails the attempt. In async/ssp mode each shard snapshots at
// once and the manifest records each shard's own version (see
// docs/recovery.md). A final checkpoint is of the stopped shards (or of
// the state they retained) and must be the newest; another checkpoint of
// the retained state (the best model so far) is named after the step of
// the evaluation that retained it.
func checkpointAt(mode config.Mode, maxSteps int64, a Checkpoint, versions []int64, ahead int64) (step, at int64, skip string) {
	hi := int64(0)
	for _, v := range versions {
		hi = max(hi, v)
	}
	switch {
	case a.Final:
		return max(hi, a.Latest+1), 0, ""
	case a.Retained:
		// The best model so far (--patience): the shards write what the
		// evaluation's pull retained, whatever their versions now.
		step = a.Step
	case mode == config.Sync && hi >= maxSteps:
		// Not past the last step: a shard that stops there would never
		// reach the version (the final checkpoint covers the end).
		return hi, 0, "training is at its last step"
	case mode == config.Sync:
		at = min(hi+ahead, maxSteps)
		step = at
	default:
		step = hi
	}
	if step <= a.Latest {
		return step, at, fmt.Sprintf("a checkpoint at step %d exists", a.Latest)
	}
	return step, at, ""
}

// writeCheckpoint has every shard snapshot and write its slice, then
// commits the manifest.
func (c *Chief) writeCheckpoint(ctx context.Context, a Checkpoint, versions []int64, ahead int64) CheckpointResult {
	t0 := c.cfg.Now()
	r := c.cfg.Run
	if a.Final && a.Stopped && !a.Retained && a.Latest > 0 {
		// The newest checkpoint may hold the final state already (a
		// checkpoint landed on the last step): mark it final rather than
		// write the same state again under the next step's name.
		ok, err := c.cfg.Store.MarkFinal(a.Latest, versions)
		if err != nil {
			c.cfg.Log.Warn("could not mark the newest checkpoint final; writing a new final checkpoint", "err", err)
		}
		if ok {
			return CheckpointResult{Step: a.Latest, Reused: true, Duration: c.cfg.Now().Sub(t0)}
		}
	}
	step, at, skip := checkpointAt(r.Mode, c.maxSteps(), a, versions, ahead)
	if skip != "" {
		return CheckpointResult{Step: step, Skipped: skip}
	}
	res, _ := c.writeShardsAndCommit(ctx, a, step, at, nil)
	if res.Err != nil {
		// Nothing of a failed attempt stays on disk: without this, a disk
		// that stays full keeps one more .tmp directory per attempt.
		c.removeLeftovers()
		return res
	}
	res.Duration = c.cfg.Now().Sub(t0)
	return res
}

// removeLeftovers deletes the temporary directories of failed or crashed
// checkpoint attempts. The chief has one checkpoint in flight at a time,
// and calls it before and after each attempt, when none is.
func (c *Chief) removeLeftovers() {
	removed, err := c.cfg.Store.RemoveTemporaries()
	switch {
	case err != nil:
		c.cfg.Log.Warn("could not remove what failed checkpoints left", "err", err)
	case len(removed) > 0:
		c.cfg.Log.Info("removed what failed checkpoints left", "removed", removed)
	}
}

// writeShardsAndCommit has every shard write its slice of the checkpoint
// of step (at version at), then commits the manifest. With keep the
// commit's check reads the shard files, and their tensors keep accepts
// are returned (checkpoint.Store.CommitReading).
func (c *Chief) writeShardsAndCommit(ctx context.Context, a Checkpoint, step, at int64, keep func(string) bool) (CheckpointResult, []checkpoint.ShardRead) {
	r := c.cfg.Run
	c.removeLeftovers()
	resps := make([]*pb.CheckpointResponse, len(c.cfg.PS))
	errs := make([]error, len(c.cfg.PS))
	var wg sync.WaitGroup
	for s, p := range c.primaries() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			resp, err := p.Client.Checkpoint(cctx, &pb.CheckpointRequest{Step: step, AtVersion: at, RunId: c.cfg.RunID, Retained: a.Retained})
			if err != nil {
				errs[s] = fmt.Errorf("ps/%d: %s", s, status.Convert(err).Message())
				if status.Code(err) == codes.FailedPrecondition && !a.Retained {
					errs[s] = fmt.Errorf("%w: %w", errTooLate, errs[s])
				}
				return
			}
			resps[s] = resp
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return CheckpointResult{Step: step, Err: err}, nil
	}
	res := CheckpointResult{Step: step}
	infos := make([]checkpoint.ShardInfo, len(resps))
	version := resps[0].Version
	var positions []int64
	for s, in := range resps {
		infos[s] = checkpoint.ShardInfo{Index: s, File: in.File, SHA256: in.Sha256, Bytes: in.Bytes, Tensors: in.Tensors, Version: in.Version}
		res.Bytes += in.Bytes
		res.Pause = max(res.Pause, time.Duration(in.PauseSeconds*float64(time.Second)))
		version = min(version, in.Version)
		res.Version = max(res.Version, in.Version)
		positions = maxPositions(positions, in.DataPositions)
	}
	res.Positions = positions
	m := checkpoint.Manifest{Step: step, Version: version, Mode: string(r.Mode), ModelSpec: c.cfg.Spec.JSON(),
		RunConfig: r.JSON(), Optimizer: checkpoint.Optimizer{Name: r.Optimizer,
			Hyperparams: map[string]float64{"lr": r.LR, "momentum": r.Momentum},
			Schedule:    r.LRSchedule, WarmupSteps: r.WarmupSteps},
		Shards: infos, Final: a.Final, DataPositions: positions, ShardWeights: c.layout.Weights}
	var read []checkpoint.ShardRead
	var err error
	if keep != nil {
		read, err = c.cfg.Store.CommitReading(m, a.KeepGood, keep)
	} else {
		err = c.cfg.Store.CommitKeeping(m, a.KeepGood)
	}
	if err != nil && !errors.Is(err, checkpoint.ErrRetention) {
		res.Err = err
		return res, nil
	} else if err != nil {
		c.cfg.Log.Warn("checkpoint committed, but deleting old ones failed", "err", err)
	}
	return res, read
}

// maxPositions is the element-wise maximum: a worker's position is the
// furthest any shard counted (docs/recovery.md, "Data positions").
func maxPositions(a, b []int64) []int64 {
	if len(a) < len(b) {
		a = append(a, make([]int64, len(b)-len(a))...)
	}
	for i, x := range b {
		a[i] = max(a[i], x)
	}
	return a
}

// reinit carries out a Reinit: every shard gets its slice of the model
// the evaluator holds, at version, and is stopped again.
func (c *Chief) reinit(ctx context.Context, a Reinit) error {
	params := c.cfg.Evaluator.Params()
	for s := range c.cfg.PS {
		flat := make([]float32, c.plan.Shards[s].Size)
		c.plan.Gather(s, params, flat)
		if err := c.initShard(ctx, s, shardInit{params: flat, version: a.Version}, a.Generation); err != nil {
			return err
		}
	}
	_, err := c.stopShards(ctx)
	return err
}
