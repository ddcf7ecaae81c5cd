package ps

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/optim"
	pb "github.com/pstrain/pstrain/proto"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// shardOp is one input of the shard state machine, as a primary applies it
// and forwards it to its standby.
type shardOp struct {
	worker  int
	version int64 // relative: the shard's version minus this
	grad    []float32
	live    []int // non-nil: a SetLive instead of a push
}

func randomOps(r *rand.Rand, n, workers, size int) []shardOp {
	ops := make([]shardOp, n)
	for i := range ops {
		if r.IntN(10) == 0 {
			var live []int
			for w := range workers {
				if r.IntN(4) != 0 {
					live = append(live, w)
				}
			}
			ops[i] = shardOp{live: append([]int{}, live...)}
			continue
		}
		g := make([]float32, size)
		scale := float32(1)
		if r.IntN(15) == 0 {
			scale = 1e4 // an outlier for the norm guard
		}
		for j := range g {
			g[j] = (r.Float32()*2 - 1) * scale
		}
		ops[i] = shardOp{worker: r.IntN(workers), version: int64(r.IntN(2)), grad: g}
	}
	return ops
}

func applyOp(t *testing.T, s *Shard, op shardOp) {
	t.Helper()
	if op.live != nil {
		s.SetLive(op.live)
		return
	}
	if _, err := s.PushAt(op.worker, max(0, s.Version()-op.version), op.grad, 0); err != nil {
		t.Fatal(err)
	}
}

func newStateShard(t *testing.T, cfg ShardConfig, opt string, params []float32) *Shard {
	t.Helper()
	o, err := optim.New(optim.Config{Name: opt, LR: 0.01, Momentum: 0.9}, len(params))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewShard(cfg, slices.Clone(params), o, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// copyShard builds a standby's copy of s the way replication does: a new
// shard from what an Init carries (parameters, optimizer state, version),
// then SetState.
func copyShard(t *testing.T, s *Shard, cfg ShardConfig, opt string) *Shard {
	t.Helper()
	c := newStateShard(t, cfg, opt, s.Params())
	st, steps := s.Optimizer().State()
	if err := c.Optimizer().SetState(slices.Clone(st), steps); err != nil {
		t.Fatal(err)
	}
	c.version = s.Version()
	b, err := proto.Marshal(s.State().Proto())
	if err != nil {
		t.Fatal(err)
	}
	var m pb.ShardState
	if err := proto.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if err := c.SetState(shardStateFromProto(&m)); err != nil {
		t.Fatal(err)
	}
	return c
}

// A copy taken at any moment — in the middle of a sync step, with the
// norm guard warm, after workers died — and fed the same inputs as the
// original stays equal to it bit for bit: what makes a hot standby's
// promotion lose nothing.
func TestShardStateCopyStaysEqual(t *testing.T) {
	modes := []struct {
		name string
		cfg  ShardConfig
		opt  string
	}{
		{"sync mean", ShardConfig{Mode: config.Sync, Replicas: 3, Workers: 3, NormGuard: 10}, "momentum"},
		{"sync backup", ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 3}, "adam"},
		{"sync trimmed", ShardConfig{Mode: config.Sync, Replicas: 4, Workers: 4, Aggregate: config.TrimmedMean}, "sgd"},
		{"async", ShardConfig{Mode: config.Async, Workers: 3, NormGuard: 10}, "momentum"},
		{"ssp", ShardConfig{Mode: config.SSP, Workers: 3, Staleness: 2}, "adam"},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			for seed := range uint64(6) {
				r := rand.New(rand.NewPCG(seed, 17))
				params := make([]float32, 37)
				for i := range params {
					params[i] = r.Float32()
				}
				orig := newStateShard(t, m.cfg, m.opt, params)
				ops := randomOps(r, 300, m.cfg.Workers, len(params))
				cut := r.IntN(len(ops))
				for _, op := range ops[:cut] {
					applyOp(t, orig, op)
				}
				c := copyShard(t, orig, m.cfg, m.opt)
				if a, b := stateText(t, orig), stateText(t, c); a != b {
					t.Fatalf("seed %d: the copy's state differs at once:\n%s\n%s", seed, a, b)
				}
				for _, op := range ops[cut:] {
					applyOp(t, orig, op)
					applyOp(t, c, op)
				}
				if orig.Version() != c.Version() || !slices.Equal(orig.Params(), c.Params()) {
					t.Fatalf("seed %d (copied after %d ops): versions %d and %d, parameters equal: %v",
						seed, cut, orig.Version(), c.Version(), slices.Equal(orig.Params(), c.Params()))
				}
				if a, b := stateText(t, orig), stateText(t, c); a != b {
					t.Fatalf("seed %d: states differ after the same ops:\n%s\n%s", seed, a, b)
				}
				if orig.Version() == 0 {
					t.Fatalf("seed %d: nothing was applied: the test proves nothing", seed)
				}
			}
		})
	}
}

// stateText is the shard's state as text, to compare two shards'.
func stateText(t *testing.T, s *Shard) string {
	t.Helper()
	return prototext.Format(s.State().Proto())
}

func TestShardStateRefusesAMismatch(t *testing.T) {
	cfg := ShardConfig{Mode: config.Sync, Replicas: 2, Workers: 2}
	s := newStateShard(t, cfg, "sgd", make([]float32, 4))
	if _, err := s.Push(0, 0, grad(1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	st := s.State()
	other := newStateShard(t, cfg, "sgd", make([]float32, 3))
	if err := other.SetState(st); err == nil {
		t.Fatal("a step sum for 4 parameters was accepted by a shard of 3")
	}
	st.Live = st.Live[:1]
	if err := newStateShard(t, cfg, "sgd", make([]float32, 4)).SetState(st); err == nil {
		t.Fatal("per-worker lists of different lengths were accepted")
	}
}
