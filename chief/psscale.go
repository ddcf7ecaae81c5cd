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
	"github.com/pstrain/pstrain/transport/rowclient"
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
	res := c.writeShardsAndCommit(ctx, Checkpoint{Latest: a.Latest, KeepGood: -1}, a.Step, at)
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
			mv, err := c.loadMove(plan, a.Step, a.To)
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
// new layout: each new shard's Init.
type move struct {
	step   int64
	layout partition.Layout
	plan   partition.Plan
	shards []shardInit
	// A model with tables: parts are the checkpoint's rows by the shard
	// of the before shards that held them; arriving[s] the rows each
	// new shard is loaded with after its Init when the shards keep the
	// rows that stay (rowsOf). (nil: the model has no tables.)
	before   int
	parts    [][]shardckpt.TableRows
	arriving [][]shardckpt.TableRows
	// all is every new shard's rows, placed (rowsOf) the first time a
	// shard of both layouts did not keep its rows.
	allOnce sync.Once
	all     [][]shardckpt.TableRows
	allErr  error
}

// loadMove reads the newest checkpoint, which must be of step, and
// reshards it for the layout to (from the plan from, which it logs what
// the change moves of), each shard at the highest version a shard of it
// wrote (sync: the boundary's, which every shard wrote; async and ssp:
// the furthest shard's, core_psscale_async.go).
func (c *Chief) loadMove(from partition.Plan, step int64, to partition.Layout) (*move, error) {
	plan, err := to.Plan(c.cfg.Spec)
	if err != nil {
		return nil, err
	}
	ck, err := c.boundaryCheckpoint(step)
	if err != nil {
		return nil, err
	}
	// The dense state and, for a model with tables, the rows, in one
	// read of the files.
	var st shardckpt.State
	var rows [][]shardckpt.TableRows
	if c.loadsRows(ck) {
		st, rows, err = shardckpt.ReadWithRows(ck, c.cfg.Spec, c.cfg.Run.Optimizer)
	} else {
		st, err = shardckpt.Read(ck, c.cfg.Spec, c.cfg.Run.Optimizer)
	}
	if err != nil {
		return nil, fmt.Errorf("chief: the PS count change's checkpoint: %w", err)
	}
	before := len(ck.Manifest.Shards) // the layout whose shards wrote the rows
	mv := &move{step: step, layout: to, plan: plan, before: before, parts: rows}
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
		// A shard of both layouts keeps the rows it snapshotted for this
		// checkpoint that stay on it, if it still holds them. (The
		// manifest lists the shards by index.)
		if in.rowsLoading && s < before {
			in.keepRows, in.keepVersion = true, ck.Manifest.Shards[s].Version
		}
		mv.shards = append(mv.shards, in)
	}
	if c.loadsRows(ck) {
		mv.arriving = c.moveRows(rows, to.PS)
	}
	return mv, nil
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

// moveRows places a checkpoint's embedding rows (byShard[j]: as shard j
// stored them) on the shards of n, a key's row on shard
// embed.ShardOf(table, key, n), leaving out the rows that stay where
// they are (rowclient.SplitArriving): the rows each shard of n is loaded
// with if the shards of both layouts keep theirs. It runs in loadMove,
// beside the workers' switch, and the chief holds every row until the
// switch loads them.
func (c *Chief) moveRows(byShard [][]shardckpt.TableRows, n int) [][]shardckpt.TableRows {
	var rows, bytes, arriving int64
	for _, ts := range byShard {
		for _, t := range ts {
			rows, bytes = rows+int64(len(t.Keys)), bytes+t.Bytes()
		}
	}
	out := rowclient.SplitArriving(byShard, n)
	for _, ts := range out {
		arriving += int64(countRows(ts))
	}
	c.cfg.Log.Info("PS count change: the embedding rows read for the new layout", "ps", n, "rows", rows,
		"mib", fmt.Sprintf("%.2f", float64(bytes)/(1<<20)), "rows_moving", arriving)
	return out
}

// rowsOf is the rows shard s of the move's layout is loaded with: those
// arriving if it kept its own (or is new), else all its rows, placed
// from the checkpoint's once for every shard that needs them (a process
// restarted during the change holds no rows to keep).
func (mv *move) rowsOf(s int, kept bool) ([]shardckpt.TableRows, error) {
	if kept || s >= mv.before {
		return mv.arriving[s], nil
	}
	mv.allOnce.Do(func() {
		var flat []shardckpt.TableRows
		for _, ts := range mv.parts {
			flat = append(flat, ts...)
		}
		mv.all, mv.allErr = rowclient.SplitRows(flat, mv.layout.PS)
	})
	if mv.allErr != nil {
		return nil, mv.allErr
	}
	return mv.all[s], nil
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
		if rs, err = c.loadMove(c.plan, a.Step, a.To); err != nil {
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

// initMoved initialises shard s of the move's layout in generation gen,
// then loads its embedding rows (the shard holds row requests until
// they are in). Both are one attempt of the Init's retries: a shard
// whose process dies during the load is initialised and loaded again
// once it is back.
func (c *Chief) initMoved(ctx context.Context, s int, mv *move, gen int64) error {
	if mv.arriving == nil {
		return c.initShard(ctx, s, mv.shards[s], gen)
	}
	return c.initShardThen(ctx, s, mv.shards[s], gen, func(ctx context.Context, cl pb.ParameterServerClient, resp *pb.InitResponse) error {
		kept := resp.GetRowsKept()
		rows, err := mv.rowsOf(s, kept)
		if err != nil {
			return fmt.Errorf("placing the embedding rows of shard %d: %w", s, err)
		}
		if kept {
			c.cfg.Log.Info("PS count change: the shard kept its rows that stay", "shard", s, "rows_arriving", countRows(rows))
		} else if s < mv.before {
			c.cfg.Log.Warn("PS count change: the shard no longer held its rows (restarted?): loading all of them", "shard", s, "rows", countRows(rows))
		}
		if err := rowclient.LoadShard(ctx, cl, rows, c.cfg.RunID, gen, 0); err != nil {
			return fmt.Errorf("loading the embedding rows onto shard %d: %w", s, err)
		}
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
	return useRows(c.cfg)
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

// countRows is the number of rows of tables.
func countRows(tables []shardckpt.TableRows) int {
	n := 0
	for _, t := range tables {
		n += len(t.Keys)
	}
	return n
}
