package chief

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/internal/atomicfile"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

// shardInit is what Init gives one shard.
type shardInit struct {
	params, opt []float32
	optSteps    int64
	version     int64
	positions   []int64 // each worker's data position (nil: the start)
	rowsLoading bool    // the checkpoint's rows are loaded after the Init (by the chief, or rowsFrom)
	// keepRows asks the shard to keep the rows it held when it
	// snapshotted keepVersion, those the new layout leaves on it
	// (InitRequest.keep_rows): a live PS count change's initMoved.
	keepRows    bool
	keepVersion int64
	// rowsFrom (nil: the chief loads the rows), with rowsLoading, has
	// the shard load its rows itself from the committed checkpoint of
	// that step (InitRequest.rows_from_checkpoint): a live PS count
	// change's. timeout bounds each attempt of the Init (0: psCallTimeout),
	// such a load included.
	rowsFrom *int64
	timeout  time.Duration
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
	ck     *checkpoint.Checkpoint // its embedding rows are loaded after the Inits
}

// loadLatest reads the newest checkpoint that verifies, skipping (and
// logging) damaged newer ones. It returns nil if there is none, and an
// error wrapping checkpoint.ErrAllDamaged if there are checkpoints but
// none verifies.
func (c *Chief) loadLatest() (*restored, error) {
	if c.cfg.Store == nil {
		return nil, nil
	}
	info, skipped, err := c.cfg.Store.Latest()
	for _, sk := range skipped {
		c.cfg.Log.Warn("skipping a damaged checkpoint", "path", sk.Path, "err", sk.Err)
	}
	if errors.Is(err, checkpoint.ErrNoCheckpoint) && !errors.Is(err, checkpoint.ErrAllDamaged) {
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
	r := &restored{step: info.Step, path: info.Path, final: ck.Manifest.Final, ck: ck}
	for s := range c.cfg.PS {
		p, o := st.Shard(c.plan, s)
		r.shards = append(r.shards, shardInit{params: p, opt: o, optSteps: st.OptimizerSteps,
			version: ck.Manifest.Version, positions: ck.Manifest.DataPositions})
	}
	return r, nil
}

// ResumeRefusal is why a run resuming from store must not start: every
// checkpoint there is damaged (each named, with why). Starting afresh
// would silently throw the run's progress away; --resume=false does so
// deliberately. It is nil when store holds a valid checkpoint or none.
// `pstrain run` asks before it starts any process; the chief refuses
// likewise.
func ResumeRefusal(store *checkpoint.Store) error {
	_, _, err := store.Latest()
	return resumeRefusal(store, err)
}

func resumeRefusal(store *checkpoint.Store, err error) error {
	if !errors.Is(err, checkpoint.ErrAllDamaged) {
		return nil
	}
	return fmt.Errorf("cannot resume from %s: %w; pass --resume=false to start afresh (the damaged checkpoints are then moved to %s)",
		store.Dir(), err, filepath.Join(store.Dir(), "archive-TIME"))
}

// archiveOld moves the complete checkpoints in the store's directory into
// DIR/archive-<time>/ so that a new run never mixes its checkpoints with
// another run's, then deletes the oldest archives beyond --keep-archives.
func (c *Chief) archiveOld() error {
	if c.cfg.Store == nil {
		return nil
	}
	dir, n, err := c.cfg.Store.Archive(c.cfg.Now())
	if err != nil {
		return err
	}
	if n > 0 {
		c.cfg.Log.Warn("starting a new run: moved the previous checkpoints aside", "count", n, "to", dir)
	}
	pruned, err := c.cfg.Store.PruneArchives(c.cfg.Run.KeepArchives)
	if err != nil {
		// Old archives cost disk, not correctness.
		c.cfg.Log.Warn("could not delete old checkpoint archives", "err", err)
	} else if len(pruned) > 0 {
		c.cfg.Log.Info("deleted old checkpoint archives (--keep-archives)", "keep", c.cfg.Run.KeepArchives, "deleted", pruned)
	}
	return nil
}

// initShard sends shard s its state in generation gen.
func (c *Chief) initShard(ctx context.Context, s int, in shardInit, gen int64) error {
	return c.initShardThen(ctx, s, in, gen, nil)
}

// initShardThen sends shard s its state in generation gen and, if then
// is set, calls it with the shard's client and the Init's answer after
// the Init, as one attempt: a process that dies during then (and is
// restarted, empty) gets the Init again before then is retried. The Init
// has psCallTimeout; then bounds its own calls.
func (c *Chief) initShardThen(ctx context.Context, s int, in shardInit, gen int64, then func(context.Context, pb.ParameterServerClient, *pb.InitResponse) error) error {
	r := c.cfg.Run
	c.mu.Lock()
	live := c.core.Live(c.cfg.Now())
	slots := c.core.DataSlots()
	c.mu.Unlock()
	req := &pb.InitRequest{DataSlots: int32(slots), RunId: c.cfg.RunID, Shard: int32(s), NumShards: int32(r.PS), ShardOptions: c.shardOptions().Proto(),
		Params: wire.Bytes(in.params), Version: in.version, MaxVersion: c.maxSteps(), LiveWorkers: live,
		Generation: gen, ModelSpec: convert.ModelSpec(c.cfg.Spec), OptimizerStep: in.optSteps,
		StepsPerEpoch: StepsPerEpoch(r, c.cfg.TrainN), DataPositions: in.positions, Tables: c.tableSpecs(),
		RowsLoading: in.rowsLoading, ShardWeights: c.layout.Weights32(), KeepRows: in.keepRows, KeepRowsVersion: in.keepVersion,
		RowsFromCheckpoint: in.rowsFrom}
	if len(in.opt) > 0 {
		req.OptimizerState = wire.Bytes(in.opt)
	}
	p := c.primary(s)
	req.Epoch, req.StandbyAddr = c.standbyFor(ctx, s)
	return c.retryPS(ctx, s, p, "init", func(ctx context.Context) error {
		timeout := psCallTimeout
		if in.timeout > 0 {
			timeout = in.timeout
		}
		ictx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := p.Client.Init(ictx, req)
		cancel()
		if err != nil || then == nil {
			return err
		}
		return then(ctx, p.Client, resp)
	})
}

// standbyFor is what shard s's Init says of hot standbys: the shard's
// epoch and its standby's address when that process answers Status
// ("" otherwise: the primary goes on alone until the chief sees the
// standby back). Without hot standbys: 0 and "".
func (c *Chief) standbyFor(ctx context.Context, s int) (epoch int64, addr string) {
	if len(c.cfg.Standbys) == 0 {
		return 0, ""
	}
	c.mu.Lock()
	r := c.core.Replica(s)
	c.mu.Unlock()
	o := c.process(other(r.Primary), s)
	if st := c.status(ctx, o); st.Err != nil {
		c.cfg.Log.Warn("the shard's standby does not answer: its primary starts alone", "shard", s, "standby", task(other(r.Primary), s), "err", st.Err)
		return r.Epoch, ""
	}
	return r.Epoch, o.Addr
}

// initCluster initialises every shard at the start of a run: from the
// newest valid checkpoint when resuming, else from the seed (moving any
// older run's checkpoints aside). It returns the starting step and the
// newest checkpoint's step (-1: none).
func (c *Chief) initCluster(ctx context.Context, a InitCluster) (step, latest int64, err error) {
	inits, latest := c.freshInit(), int64(-1)
	var ck *checkpoint.Checkpoint
	maxSteps := MaxSteps(c.cfg.Run, c.cfg.TrainN)
	if a.Resume {
		rs, err := c.loadLatest()
		switch {
		case errors.Is(err, shardckpt.ErrMismatch):
			c.cfg.Log.Warn("the checkpoints are of another run; starting a new one", "why", err)
		case errors.Is(err, checkpoint.ErrAllDamaged):
			return 0, 0, fmt.Errorf("chief: %w", resumeRefusal(c.cfg.Store, err))
		case err != nil:
			return 0, 0, fmt.Errorf("chief: resuming from %s: %w (pass --resume=false to start afresh)", c.cfg.Store.Dir(), err)
		case rs == nil:
		case rs.final || rs.shards[0].version >= maxSteps:
			c.cfg.Log.Warn("the newest checkpoint is of a finished run; starting a new one", "path", rs.path, "step", rs.step)
		default:
			inits, latest, ck = rs.shards, rs.step, rs.ck
			c.cfg.Log.Info("resuming from checkpoint", "path", rs.path, "step", rs.step)
		}
	}
	if latest < 0 {
		if err := c.archiveOld(); err != nil {
			return 0, 0, fmt.Errorf("chief: moving old checkpoints aside: %w", err)
		}
	}
	for s := range c.cfg.PS {
		inits[s].rowsLoading = c.loadsRows(ck)
		if err := c.initShardThen(ctx, s, inits[s], a.Generation, c.rowsLoader(ck, s, a.Generation)); err != nil {
			return 0, 0, err
		}
	}
	return inits[0].version, latest, nil
}

// restore re-initialises the target shards, in generation gen, from the
// newest valid checkpoint (or the initial weights if there is none), and
// returns the checkpoint's step.
func (c *Chief) restore(ctx context.Context, targets []int, gen int64) (int64, error) {
	rs, err := c.loadLatest()
	if err != nil {
		c.cfg.Log.Error("cannot read the checkpoints; restoring the initial weights", "err", err)
		rs = nil
	}
	inits := c.freshInit()
	var restoredStep int64
	var ck *checkpoint.Checkpoint
	if rs != nil {
		inits, restoredStep, ck = rs.shards, rs.step, rs.ck
	} else {
		c.cfg.Log.Error("no valid checkpoint: restoring the initial weights", "shards", targets)
	}
	for _, t := range targets {
		inits[t].rowsLoading = c.loadsRows(ck)
		if err := c.initShardThen(ctx, t, inits[t], gen, c.rowsLoader(ck, t, gen)); err != nil {
			return 0, err
		}
	}
	return restoredStep, nil
}

// saveState writes st unless a newer state is written already.
func (c *Chief) saveState(st State) {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	if c.cfg.StatePath == "" || st.Seq <= c.saved {
		return
	}
	b, _ := json.Marshal(st)
	// (Not synced: saved from heartbeats, which a slow disk's flushes
	// would hold up. A killed chief leaves it whole; a crashed machine
	// may lose the last saves.)
	if err := atomicfile.Write(c.cfg.StatePath, b, 0o600, atomicfile.Options{}); err == nil {
		c.saved = st.Seq
		return
	}
	c.cfg.Log.Warn("could not save the chief state; a restarted chief will lose the report's history, and no chunk of the data queue is handed out until it can", "path", c.cfg.StatePath)
}

// savedAtLeast says the state numbered seq, or a newer one, is written
// (always, without a state file).
func (c *Chief) savedAtLeast(seq int64) bool {
	c.stateMu.Lock()
	defer c.stateMu.Unlock()
	return c.cfg.StatePath == "" || c.saved >= seq
}

func (c *Chief) loadState() (State, bool) {
	var st State
	if c.cfg.StatePath == "" {
		return st, false
	}
	b, err := os.ReadFile(c.cfg.StatePath)
	if err != nil || json.Unmarshal(b, &st) != nil || st.RunID != c.cfg.RunID {
		return State{}, false
	}
	return st, true
}
