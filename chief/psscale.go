package chief

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/ml/partition"
	pb "github.com/pstrain/pstrain/proto"
)

// The driver's half of a live change of the PS count (core_psscale.go):
// the boundary's checkpoint, and the switch to the layout of the new
// count. Both run on the loop's goroutine while every shard holds the
// workers at the boundary; no evaluation or checkpoint job runs then
// (the core starts none during a change), so the layout (cfg.PS, plan,
// Run.PS) changes under no reader.

// ScalePS asks for n parameter servers (docs/elastic.md, "Parameter
// servers"); --scale-file's "ps" is the task's way to call it.
func (c *Chief) ScalePS(n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.core.ScalePS(n, c.cfg.Now())
}

// snapshotShards carries out a SnapshotShards: the checkpoint of the
// step every shard is held at (Own: of each shard's version now).
//
// It also starts reading the checkpoint back, resharded for the new
// count, on a goroutine of its own (it ends by itself), while the
// workers switch layouts: SwitchLayout then only sends the Inits.
func (c *Chief) snapshotShards(ctx context.Context, a SnapshotShards) CheckpointResult {
	t0 := c.cfg.Now()
	c.moved = nil
	at := a.Step
	if a.Own {
		at = 0
	}
	// The commit reads the dense tensors as it checks the files, so
	// reading them back for the new layout hashes nothing again.
	res, dense := c.writeShardsAndCommit(ctx, Checkpoint{Latest: a.Latest, KeepGood: -1}, a.Step, at, shardckpt.Dense)
	if res.Err != nil {
		c.removeLeftovers()
		return res
	}
	res.Duration = c.cfg.Now().Sub(t0)
	c.cfg.Log.Info("PS count change: the boundary's checkpoint is written", "step", a.Step,
		"version", res.Version, "bytes", res.Bytes, "seconds", fmt.Sprintf("%.3f", res.Duration.Seconds()))
	if a.To.PS > 0 {
		loaded := make(chan loadedMove, 1)
		plan := c.plan
		go func() {
			mv, err := c.loadMove(plan, a.Step, a.To, dense)
			loaded <- loadedMove{mv, err}
		}()
		c.moved = loaded
	}
	return res
}

// loadedMove is loadMove's outcome.
type loadedMove struct {
	mv  *move
	err error
}

// move is the checkpoint of a PS count change's boundary, read for the
// new layout: each new shard's Init. A model's embedding rows are not
// read here: each shard of the new layout loads its own from the
// checkpoint's files (InitRequest.rows_from_checkpoint).
type move struct {
	step   int64
	layout partition.Layout
	plan   partition.Plan
	shards []shardInit
}

// loadMove reads the dense state of the newest checkpoint, which must
// be of step, and reshards it for the layout to (from the plan from,
// which it logs what the change moves of), each shard at the highest
// version a shard of it wrote (sync: the boundary's, which every shard
// wrote; async and ssp: the furthest shard's, core_psscale_async.go).
// dense, if not nil, is the checkpoint's dense tensors as its commit
// read and verified them (shardckpt.ReadFrom); else the files are read.
func (c *Chief) loadMove(from partition.Plan, step int64, to partition.Layout, dense []checkpoint.ShardRead) (*move, error) {
	plan, err := to.Plan(c.cfg.Spec)
	if err != nil {
		return nil, err
	}
	ck, err := c.boundaryCheckpoint(step)
	if err != nil {
		return nil, err
	}
	var st shardckpt.State
	if dense != nil {
		st, err = shardckpt.ReadFrom(ck, c.cfg.Spec, c.cfg.Run.Optimizer, dense)
	} else {
		st, err = shardckpt.Read(ck, c.cfg.Spec, c.cfg.Run.Optimizer)
	}
	if err != nil {
		return nil, fmt.Errorf("chief: the PS count change's checkpoint: %w", err)
	}
	before := len(ck.Manifest.Shards) // the layout whose shards wrote the checkpoint
	mv := &move{step: step, layout: to, plan: plan}
	version := ck.Manifest.Version
	for _, sh := range ck.Manifest.Shards {
		version = max(version, sh.Version)
	}
	moved := partition.MovedElements(partition.Moves(from, plan))
	c.cfg.Log.Info("PS count change: the model's rows on the new layout", "ps", to.String(), "moved_mib",
		fmt.Sprintf("%.2f", float64(4*moved)/(1<<20)), "of_mib", fmt.Sprintf("%.2f", float64(4*c.cfg.Spec.NumParams())/(1<<20)))
	for s := range to.PS {
		p, o := st.Shard(plan, s)
		in := shardInit{params: p, opt: o, optSteps: st.OptimizerSteps,
			version: version, positions: ck.Manifest.DataPositions, rowsLoading: c.loadsRows(ck)}
		if in.rowsLoading {
			// Each shard loads its rows from the checkpoint's files; one
			// of both layouts keeps the rows it snapshotted for this
			// checkpoint that stay on it, if it still holds them, and
			// loads only those arriving. (The manifest lists the shards
			// by index.)
			in.rowsFrom, in.timeout = &ck.Manifest.Step, rowsLoadTimeout(ck)
			if s < before {
				in.keepRows, in.keepVersion = true, ck.Manifest.Shards[s].Version
			}
		}
		mv.shards = append(mv.shards, in)
	}
	return mv, nil
}

// rowsLoadTimeout bounds the Init of a shard that loads its rows from
// ck: the Init's usual time, and a second per 10 MB of the checkpoint's
// files, which a shard that kept no rows reads in full (hundreds of MB a
// second on a local disk; a slow shared one may give far less).
func rowsLoadTimeout(ck *checkpoint.Checkpoint) time.Duration {
	var bytes int64
	for _, sh := range ck.Manifest.Shards {
		bytes += sh.Bytes
	}
	return psCallTimeout + time.Duration(bytes/10e6)*time.Second
}

// boundaryCheckpoint is the newest checkpoint, which must be of step,
// checked cheaply: reading its files checks their hashes (Store.Latest
// would read and hash them once more).
func (c *Chief) boundaryCheckpoint(step int64) (*checkpoint.Checkpoint, error) {
	infos, err := c.cfg.Store.List()
	if err == nil && len(infos) == 0 {
		err = checkpoint.ErrNoCheckpoint
	}
	if err == nil {
		err = infos[0].Err
	}
	if err != nil {
		return nil, fmt.Errorf("chief: the PS count change's checkpoint: %w", err)
	}
	if info := infos[0]; info.Step != step {
		return nil, fmt.Errorf("chief: the PS count change's checkpoint of step %d is not the newest (%d is)", step, info.Step)
	}
	ck, err := c.cfg.Store.Load(infos[0].Path)
	if err != nil {
		return nil, fmt.Errorf("chief: the PS count change's checkpoint: %w", err)
	}
	return ck, nil
}

// switchLayout carries out a SwitchLayout: the layout of a.To shards
// becomes the chief's and every shard of it is initialised from the
// checkpoint of a.Step (the newest: the core orders no other during a
// change). It returns the version the shards serve from, and whether it
// sent any Init (touched: also when it fails). (The removed PS
// processes are told to exit after: retirePS.)
func (c *Chief) switchLayout(ctx context.Context, a SwitchLayout) (version int64, touched bool, err error) {
	t0 := c.cfg.Now()
	var rs *move
	if c.moved != nil {
		select {
		case l := <-c.moved:
			rs = l.mv
			if l.err != nil {
				c.cfg.Log.Warn("PS count change: reading the boundary's checkpoint failed; reading it again", "err", l.err)
			}
		case <-ctx.Done():
			return 0, false, ctx.Err()
		}
		c.moved = nil
	}
	if rs == nil || rs.step != a.Step || !rs.layout.Equal(a.To) {
		var err error
		if rs, err = c.loadMove(c.plan, a.Step, a.To, nil); err != nil {
			return 0, false, err
		}
	}
	if err := c.setLayout(a.To); err != nil {
		return 0, false, err
	}
	errs := make([]error, a.To.PS)
	var wg sync.WaitGroup
	for s := range a.To.PS {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[s] = c.initMoved(ctx, s, rs, a.Generation)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return 0, true, fmt.Errorf("chief: initialising the new layout: %w", err)
		}
	}
	c.cfg.Log.Info("PS count change: the new layout serves", "ps", a.To.String(), "version", rs.shards[0].version,
		"seconds", fmt.Sprintf("%.3f", c.cfg.Now().Sub(t0).Seconds()))
	return rs.shards[0].version, true, nil
}

// initMoved initialises shard s of the move's layout in generation gen;
// a shard with embedding tables loads its rows from the checkpoint
// before its Init answers. A shard whose process dies meanwhile is
// initialised again once it is back (the Init's retries), and then,
// holding no rows to keep, loads all of its own.
func (c *Chief) initMoved(ctx context.Context, s int, mv *move, gen int64) error {
	in := mv.shards[s]
	if !in.rowsLoading {
		return c.initShard(ctx, s, in, gen)
	}
	return c.initShardThen(ctx, s, in, gen, func(_ context.Context, _ pb.ParameterServerClient, resp *pb.InitResponse) error {
		c.cfg.Log.Info("PS count change: the shard loaded its rows from the checkpoint", "shard", s,
			"rows_kept", resp.GetRowsKept(), "rows_loaded", resp.GetRowsLoaded())
		return nil
	})
}

// setLayout makes the first l.PS PS slots the shards and l's partition
// the plan; a CTR evaluator's row client follows.
func (c *Chief) setLayout(l partition.Layout) error {
	n := l.PS
	if n < 1 || n > len(c.psSlots) {
		return fmt.Errorf("chief: %d parameter servers asked, the run has %d slots", n, len(c.psSlots))
	}
	plan, err := l.Plan(c.cfg.Spec)
	if err != nil {
		return err
	}
	c.cfg.PS, c.cfg.Run.PS, c.plan, c.layout = c.psSlots[:n], n, plan, l
	if len(c.standbySlots) > 0 {
		c.cfg.Standbys = c.standbySlots[:n]
	}
	// A CTR evaluator reads the rows of the layout's shards.
	return c.useRows()
}

// retirePS tells the PS processes of slots [from, to) to exit, in
// parallel: they hold nothing of the model any more. With hot standbys
// both processes of each slot exit.
func (c *Chief) retirePS(ctx context.Context, from, to int) {
	var wg sync.WaitGroup
	stop := func(name string, p PS) {
		defer wg.Done()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := p.Client.Stop(cctx, &pb.StopRequest{Shutdown: true}); err != nil {
			c.cfg.Log.Warn("could not tell a removed PS process to exit", "task", name, "addr", p.Addr, "err", err)
		}
	}
	for s := from; s < to; s++ {
		wg.Add(1)
		go stop(task(cluster.PS, s), c.psSlots[s])
		if s < len(c.standbySlots) {
			wg.Add(1)
			go stop(task(cluster.Standby, s), c.standbySlots[s])
		}
	}
	wg.Wait()
}

// applyScale hands the core a scale request: its worker count and, when
// it asks for one, its PS count or a rebalance's weights. Call with mu
// held.
func (c *Chief) applyScale(req ScaleRequest, now time.Time) {
	if req.Workers > 0 {
		if err := c.core.Scale(req.Workers, now); err != nil {
			c.cfg.Log.Error("scale request refused", "file", c.cfg.ScaleFile, "err", err)
		}
	}
	if req.PS > 0 {
		if err := c.core.ScalePS(req.PS, now); err != nil {
			c.cfg.Log.Error("scale request refused", "file", c.cfg.ScaleFile, "err", err)
		}
	}
	if len(req.PSWeights) > 0 {
		if err := c.core.Rebalance(req.PSWeights, req.Imbalance, now); err != nil {
			c.cfg.Log.Error("rebalance refused", "file", c.cfg.ScaleFile, "err", err)
		}
	}
}

// nudgeLoop asks the loop for a tick now: the last worker switched
// layouts, and the switch need not wait for the next poll.
func (c *Chief) nudgeLoop() {
	select {
	case c.nudge <- struct{}{}:
	default:
	}
}
