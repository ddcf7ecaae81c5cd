package chief

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pstrain/pstrain/ps"
)

// shardOptions are the options every shard is initialised with: the
// run's, with the learning-rate factor rollbacks set (Core.LRFactor).
func (c *Chief) shardOptions() ps.Options {
	o := ps.OptionsFor(c.cfg.Run)
	c.mu.Lock()
	f := c.core.LRFactor()
	c.mu.Unlock()
	if f != 1 {
		o.LRFactor = f
	}
	return o
}

// rollback carries out a Rollback: the checkpoints after a.AtMost are
// moved aside, then every shard is restored from the newest valid one
// left (the initial weights if none), in a.Generation. It returns the
// step restored and whether it came from a checkpoint.
func (c *Chief) rollback(ctx context.Context, a Rollback) (step int64, fromCheckpoint bool, err error) {
	if err := c.setAsideAfter(a.AtMost); err != nil {
		// Restoring from a diverged checkpoint would diverge again: the
		// run cannot go on safely.
		return 0, false, fmt.Errorf("chief: rolling back after a divergence: %w", err)
	}
	step, err = c.restore(ctx, allShards(len(c.cfg.PS)), a.Generation)
	// (A checkpoint of step 0 would hold the initial weights anyway.)
	return step, step > 0, err
}

// restoreBest restores every shard, in a.Generation, from the best
// model's checkpoint (the newest at or before a.AtMost) after deleting
// the run's later ones, superseded by it.
func (c *Chief) restoreBest(ctx context.Context, a Rollback) (step int64, fromCheckpoint bool, err error) {
	if c.cfg.Store == nil {
		return 0, false, fmt.Errorf("%w: no checkpoint store to hand back the best model from", ErrNothingRestored)
	}
	// Read in full (every shard's hash) before anything is deleted: a
	// checkpoint gone or damaged leaves the stopped model in place.
	if err := c.cfg.Store.Verify(c.cfg.Store.Path(a.AtMost)); err != nil {
		return 0, false, fmt.Errorf("%w: the best model's checkpoint: %w", ErrNothingRestored, err)
	}
	n, err := c.cfg.Store.RemoveAfter(a.AtMost)
	if err != nil {
		return 0, false, fmt.Errorf("%w: deleting the checkpoints after the best model's: %w", ErrNothingRestored, err)
	}
	c.cfg.Log.Info("deleted the checkpoints after the best model's", "count", n, "after_step", a.AtMost)
	step, err = c.restore(ctx, allShards(len(c.cfg.PS)), a.Generation)
	return step, step > 0, err
}

// setAsideAfter moves the checkpoints of steps after atMost into
// DIR/diverged-<time>/ (nothing is deleted), so that neither this
// rollback nor a later recovery restores them, and new checkpoints of
// those steps can be written.
func (c *Chief) setAsideAfter(atMost int64) error {
	if c.cfg.Store == nil {
		return nil
	}
	infos, err := c.cfg.Store.List()
	if err != nil {
		return err
	}
	dir := filepath.Join(c.cfg.Store.Dir(), "diverged-"+c.cfg.Now().UTC().Format("20060102T150405.000"))
	moved := 0
	for _, in := range infos {
		if in.Step <= atMost {
			continue
		}
		if moved == 0 {
			if err := os.MkdirAll(dir, c.cfg.Store.DirMode()); err != nil {
				return err
			}
		}
		if err := os.Rename(in.Path, filepath.Join(dir, filepath.Base(in.Path))); err != nil {
			return err
		}
		moved++
	}
	if moved > 0 {
		c.cfg.Log.Warn("moved the checkpoints after the last good evaluation aside", "count", moved, "after_step", atMost, "to", dir)
	}
	return nil
}

// handBack carries out a HandBack: the shards are restored as a
// rollback restores them, then stopped again (training is over).
func (c *Chief) handBack(ctx context.Context, a HandBack) HandBackResult {
	restore := c.rollback
	if a.Best {
		restore = c.restoreBest
	}
	step, fromCheckpoint, err := restore(ctx, Rollback{AtMost: a.AtMost, Generation: a.Generation})
	if err != nil {
		return HandBackResult{Err: err}
	}
	versions, err := c.stopShards(ctx)
	if err != nil {
		return HandBackResult{Err: fmt.Errorf("chief: stopping the shards after restoring step %d: %w", step, err)}
	}
	return HandBackResult{Step: step, FromCheckpoint: fromCheckpoint, Versions: versions}
}
