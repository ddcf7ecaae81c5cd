package ps

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/optim"
)

func tableCfgs(admit int, evict int64) []embed.TableConfig {
	return []embed.TableConfig{
		{Name: "emb/C1", Dim: 4, Seed: 9, Rule: embed.DefaultAdagrad(0.3), AdmitAfter: admit, EvictAfter: evict},
		{Name: "emb/C2", Dim: 2, Seed: 9, Rule: embed.Rule{Kind: embed.Momentum, LR: 0.1, Momentum: 0.9}, AdmitAfter: admit, EvictAfter: evict},
	}
}

func newTableSets(t *testing.T, cfgs []embed.TableConfig, mode config.Mode, n int) []*TableSet {
	t.Helper()
	out := make([]*TableSet, n)
	for s := range out {
		ts, err := NewTableSet(cfgs, mode, s, n, 0)
		if err != nil {
			t.Fatal(err)
		}
		out[s] = ts
	}
	return out
}

// batch is one worker's lookups of one table: keys with repeats, and a
// gradient per lookup.
type batch struct {
	keys  []uint64
	grads []float32
}

func randomBatch(rng *rand.Rand, n, dim int, vocab uint64) batch {
	b := batch{keys: make([]uint64, n), grads: make([]float32, n*dim)}
	for i := range b.keys {
		b.keys[i] = rng.Uint64N(vocab)
	}
	for i := range b.grads {
		b.grads[i] = float32(rng.NormFloat64())
	}
	return b
}

// uniqueGrads dedups a batch and combines its gradients, scaled by scale.
func uniqueGrads(t *testing.T, b batch, dim int, scale float32) ([]uint64, []float32) {
	t.Helper()
	var d embed.Deduper
	uniq, index := d.Dedup(b.keys, nil, nil)
	out := make([]float32, len(uniq)*dim)
	if err := embed.Combine(index, dim, b.grads, out); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		out[i] *= scale
	}
	return uniq, out
}

// bySlice splits unique keys and their rows by embed.ShardOf.
func byShard(table string, keys []uint64, rows []float32, dim, n int) ([][]uint64, [][]float32) {
	ks, rs := make([][]uint64, n), make([][]float32, n)
	for i, k := range keys {
		s := embed.ShardOf(table, k, n)
		ks[s] = append(ks[s], k)
		rs[s] = append(rs[s], rows[i*dim:(i+1)*dim]...)
	}
	return ks, rs
}

// A sync step of W workers over the tables of 2 shards equals one step of
// the W workers' whole batch in one process (embed.Local): rows created,
// admitted and trained alike, to float32 rounding.
func TestSyncTableStepEqualsOneBigBatchStep(t *testing.T) {
	const workers, shards, perWorker, steps = 3, 2, 40, 4
	cfgs := tableCfgs(2, 0)
	sets := newTableSets(t, cfgs, config.Sync, shards)
	local, err := embed.NewLocal(cfgs)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	for step := range int64(steps) {
		for _, c := range cfgs {
			var all batch
			for w := range workers {
				b := randomBatch(rng, perWorker, c.Dim, 30)
				all.keys, all.grads = append(all.keys, b.keys...), append(all.grads, b.grads...)
				// A worker's loss is its batch's mean: its gradient is 1/W of
				// the whole batch's for the same samples.
				keys, grads := uniqueGrads(t, b, c.Dim, 1)
				pullPushShards(t, sets, c, w, step, keys, grads)
			}
			keys, grads := uniqueGrads(t, all, c.Dim, 1/float32(workers))
			rows := make([]float32, len(keys)*c.Dim)
			if err := local.Pull(ctx, step, c.Name, keys, rows); err != nil {
				t.Fatal(err)
			}
			if err := local.Push(ctx, step, c.Name, keys, grads); err != nil {
				t.Fatal(err)
			}
		}
		for _, ts := range sets {
			if err := ts.Advance(step+1, []int{0, 1, 2}); err != nil {
				t.Fatal(err)
			}
		}
	}
	stats := local.Stats()
	for _, c := range cfgs {
		var rows int
		for _, ts := range sets {
			rows += ts.Table(c.Name).Len()
			if ts.TableStats()[c.Name].Dropped == 0 {
				t.Errorf("table %s: no gradient of an unadmitted key was dropped: the test does not exercise admission", c.Name)
			}
		}
		if rows != stats[c.Name].Rows || rows == 0 {
			t.Fatalf("table %s: %d rows over the shards, %d in one process", c.Name, rows, stats[c.Name].Rows)
		}
		compareRows(t, sets, local, c)
	}
}

// pullPushShards is a worker's step on one table: pull its unique keys
// from their shards, then push their gradients.
func pullPushShards(t *testing.T, sets []*TableSet, c embed.TableConfig, w int, step int64, keys []uint64, grads []float32) {
	t.Helper()
	ks, gs := byShard(c.Name, keys, grads, c.Dim, len(sets))
	for s, ts := range sets {
		out := make([]float32, len(ks[s])*c.Dim)
		if err := ts.Pull(c.Name, ks[s], out); err != nil {
			t.Fatal(err)
		}
		if o, err := ts.Push(w, step, c.Name, ks[s], gs[s]); err != nil || o != Applied {
			t.Fatalf("push: %v %v", o, err)
		}
	}
}

// compareRows checks every row of table c on the shards against local's.
func compareRows(t *testing.T, sets []*TableSet, local *embed.Local, c embed.TableConfig) {
	t.Helper()
	for _, ts := range sets {
		keys := ts.Table(c.Name).Keys()
		want := make([]float32, len(keys)*c.Dim)
		if err := local.Pull(context.Background(), 100, c.Name, keys, want); err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			got, _, _ := ts.Table(c.Name).Row(k)
			for j := range got {
				if w := want[i*c.Dim+j]; math.Abs(float64(got[j]-w)) > 1e-5*(1+math.Abs(float64(w))) {
					t.Fatalf("table %s key %d: %v on the shards, %v in one process", c.Name, k, got, want[i*c.Dim:(i+1)*c.Dim])
				}
			}
		}
	}
}

func TestSyncStepCountsOnlyAcceptedWorkersAndRetriesOnce(t *testing.T) {
	cfg := []embed.TableConfig{{Name: "emb/C1", Dim: 1, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}
	ts := newTableSets(t, cfg, config.Sync, 1)[0]
	row := make([]float32, 1)
	if err := ts.Pull("emb/C1", []uint64{7}, row); err != nil {
		t.Fatal(err)
	}
	init := row[0]
	for w, g := range []float32{2, 4, 100} {
		if _, err := ts.Push(w, 0, "emb/C1", []uint64{7}, []float32{g}); err != nil {
			t.Fatal(err)
		}
	}
	// Worker 1 retries its push: replaced, not added.
	if _, err := ts.Push(1, 0, "emb/C1", []uint64{7}, []float32{4}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := ts.Table("emb/C1").Row(7); got[0] != init {
		t.Fatalf("row moved before the step's end: %v", got)
	}
	// Worker 2's dense gradient was refused: its rows are left out too.
	if err := ts.Advance(1, []int{1, 0}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := ts.Table("emb/C1").Row(7); got[0] != init-3 {
		t.Fatalf("row %v, want %v - mean(2, 4)", got[0], init)
	}
	// A gradient of the step before is stale; one from the future refused.
	if o, err := ts.Push(0, 0, "emb/C1", []uint64{7}, []float32{1}); err != nil || o != Stale {
		t.Fatalf("push of an old step: %v %v", o, err)
	}
	if _, err := ts.Push(0, 5, "emb/C1", []uint64{7}, []float32{1}); !errors.Is(err, ErrFutureVersion) {
		t.Fatalf("push from the future: %v", err)
	}
	if _, err := ts.Push(0, 1, "emb/C1", []uint64{7}, []float32{float32(math.NaN())}); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("NaN push: %v", err)
	}
}

func TestAsyncTablesApplyOnArrival(t *testing.T) {
	cfg := []embed.TableConfig{{Name: "emb/C1", Dim: 1, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}
	ts := newTableSets(t, cfg, config.Async, 1)[0]
	row := make([]float32, 1)
	_ = ts.Pull("emb/C1", []uint64{7}, row)
	if _, err := ts.Push(0, 0, "emb/C1", []uint64{7}, []float32{2}); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := ts.Table("emb/C1").Row(7); got[0] != row[0]-2 {
		t.Fatalf("row %v, want %v", got[0], row[0]-2)
	}
}

func TestTablesRefuseKeysOfOtherShardsAndUnknownTables(t *testing.T) {
	sets := newTableSets(t, tableCfgs(0, 0), config.Sync, 2)
	var k uint64
	for embed.ShardOf("emb/C1", k, 2) != 1 {
		k++
	}
	out := make([]float32, 4)
	if err := sets[0].Pull("emb/C1", []uint64{k}, out); !errors.Is(err, ErrNotMine) {
		t.Fatalf("pull of shard 1's key from shard 0: %v", err)
	}
	if _, err := sets[0].Push(0, 0, "emb/C1", []uint64{k}, out); !errors.Is(err, ErrNotMine) {
		t.Fatalf("push of shard 1's key to shard 0: %v", err)
	}
	if err := sets[1].Pull("emb/C9", []uint64{k}, out); !errors.Is(err, ErrNoTable) {
		t.Fatalf("pull of an unknown table: %v", err)
	}
	if err := sets[1].Pull("emb/C1", []uint64{k}, out[:3]); !errors.Is(err, ErrBadLength) {
		t.Fatalf("pull into a short buffer: %v", err)
	}
	if sets[0].Table("emb/C1").Len()+sets[1].Table("emb/C1").Len() != 0 {
		t.Fatal("a refused request created rows")
	}
	if _, err := NewTableSet([]embed.TableConfig{{Name: "C1", Dim: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}, config.Sync, 0, 1, 0); err == nil {
		t.Fatal("a table named without emb/ was accepted")
	}
}

func TestTablesEvictAtDueStepBoundaries(t *testing.T) {
	cfg := []embed.TableConfig{{Name: "emb/C1", Dim: 1, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}, EvictAfter: 16}}
	ts := newTableSets(t, cfg, config.Async, 1)[0]
	out := make([]float32, 1)
	_ = ts.Pull("emb/C1", []uint64{1}, out) // seen at 0
	var evictedAt int64
	for v := int64(1); v <= 40 && evictedAt == 0; v++ {
		if v == 10 {
			_ = ts.Pull("emb/C1", []uint64{2}, out) // seen at 9
		}
		if err := ts.Advance(v, nil); err != nil {
			t.Fatal(err)
		}
		if _, _, ok := ts.Table("emb/C1").Row(1); !ok {
			evictedAt = v
		}
	}
	// Unseen for more than 16 steps after version 0: evicted at the first
	// boundary due (every 16/8 = 2 steps) past 16, i.e. 18; key 2 stays.
	if evictedAt != 18 {
		t.Fatalf("key 1 evicted at %d, want 18", evictedAt)
	}
	if _, _, ok := ts.Table("emb/C1").Row(2); !ok {
		t.Fatal("key 2, seen at 9, was evicted at 18")
	}
	if !EvictDue(18, 16) || EvictDue(17, 16) || EvictDue(5, 0) {
		t.Fatal("EvictDue disagrees with the rule")
	}
}

func TestTableSnapshotLoadsIntoAnotherShardCount(t *testing.T) {
	cfgs := tableCfgs(0, 0)
	two := newTableSets(t, cfgs, config.Async, 2)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range cfgs {
		keys, grads := uniqueGrads(t, randomBatch(rng, 200, c.Dim, 1000), c.Dim, 1)
		pullPushShards(t, two, c, 0, 0, keys, grads)
	}
	three := newTableSets(t, cfgs, config.Async, 3)
	for _, ts := range two {
		for _, r := range ts.Snapshot() {
			if err := three[0].Load(r); !errors.Is(err, ErrNotMine) {
				t.Fatalf("shard 0 of 3 loaded every row of %s: %v", r.Name, err)
			}
		}
	}
	if three[0].Table("emb/C1").Len() != 0 {
		t.Fatal("a refused load put rows")
	}
	for _, ts := range two {
		for _, r := range ts.Snapshot() {
			for s, part := range shardckpt.Split(r, 3) {
				if err := three[s].Load(part); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, c := range cfgs {
		var before, after []uint64
		for _, ts := range two {
			before = append(before, ts.Table(c.Name).Keys()...)
		}
		for _, ts := range three {
			after = append(after, ts.Table(c.Name).Keys()...)
		}
		slices.Sort(before)
		slices.Sort(after)
		if !slices.Equal(before, after) || len(before) == 0 {
			t.Fatalf("table %s: %d rows before, %d after", c.Name, len(before), len(after))
		}
	}
}

func TestPeekReadsWithoutCreatingRows(t *testing.T) {
	ts := newTableSets(t, tableCfgs(0, 0), config.Async, 1)[0]
	peeked, pulled := make([]float32, 8), make([]float32, 8)
	if err := ts.PullBlocks(-1, []RowBlock{{Table: "emb/C1", Keys: []uint64{3, 4}, Values: peeked}}); err != nil {
		t.Fatal(err)
	}
	if n := ts.Table("emb/C1").Len(); n != 0 {
		t.Fatalf("a peek created %d rows", n)
	}
	if err := ts.PullBlocks(0, []RowBlock{{Table: "emb/C1", Keys: []uint64{3, 4}, Values: pulled}}); err != nil {
		t.Fatal(err)
	}
	if ts.Table("emb/C1").Len() != 2 || !slices.Equal(peeked, pulled) {
		t.Fatalf("a pull after a peek: %d rows, %v vs %v", ts.Table("emb/C1").Len(), pulled, peeked)
	}
}

// The dense step tells the tables whose rows count: the workers whose
// gradients are in its aggregate, not one dropped as non-finite.
func TestShardLastStepListsTheCountedWorkers(t *testing.T) {
	opt, err := optim.New(optim.Config{Name: "sgd", LR: 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := NewShard(ShardConfig{Mode: config.Sync, Replicas: 3, Workers: 3}, []float32{0}, opt, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []int{2, 0} {
		if _, err := sh.Push(w, 0, []float32{1}); err != nil {
			t.Fatal(err)
		}
	}
	if !sh.Drop(1, 0, 0) || sh.Version() != 1 {
		t.Fatal("the dropped gradient did not complete the step")
	}
	if got := sh.LastStep(); !slices.Equal(got, []int{2, 0}) {
		t.Fatalf("LastStep %v, want the counted workers [2 0]", got)
	}
	if _, err := sh.Push(1, 1, []float32{1}); err != nil {
		t.Fatal(err)
	}
	if got := sh.LastStep(); !slices.Equal(got, []int{2, 0}) {
		t.Fatalf("LastStep %v changed before the next step completed", got)
	}
}

// BenchmarkTableSnapshot is the copy a checkpoint (or an evaluation's
// retained state) makes of a shard's table: 10^6 rows of dimension 16
// with Adagrad state.
func BenchmarkTableSnapshot(b *testing.B) {
	cfg := []embed.TableConfig{{Name: "emb/C1", Dim: 16, Seed: 1, Rule: embed.DefaultAdagrad(0.1)}}
	ts, err := NewTableSet(cfg, config.Async, 0, 1, 0)
	if err != nil {
		b.Fatal(err)
	}
	const rows, chunk = 1_000_000, 10_000
	keys, out := make([]uint64, chunk), make([]float32, chunk*16)
	for lo := 0; lo < rows; lo += chunk {
		for i := range keys {
			keys[i] = uint64(lo+i) * 0x9e3779b97f4a7c15
		}
		if err := ts.Pull("emb/C1", keys, out); err != nil {
			b.Fatal(err)
		}
	}
	// The freeze under the locks (as a retained state's is),
	// then the sort into rows a checkpoint does after releasing them.
	var slots []TableSlots
	b.Run("under-locks", func(b *testing.B) {
		for range b.N {
			slots = ts.FreezeSlots(slots)
		}
	})
	b.Run("rows", func(b *testing.B) {
		for range b.N {
			if r := slots[0].Rows(); len(r.Keys) != rows {
				b.Fatal(len(r.Keys))
			}
		}
	})
}

// A snapshot made of the slots holds exactly the live rows, sorted, after
// evictions freed slots and new rows took some of them again.
func TestSnapshotOfSlotsSkipsFreedSlots(t *testing.T) {
	cfg := []embed.TableConfig{{Name: "emb/C1", Dim: 2, Seed: 1, Rule: embed.DefaultAdagrad(0.1), EvictAfter: 1}}
	ts := newTableSets(t, cfg, config.Async, 1)[0]
	out := make([]float32, 2*4)
	_ = ts.Pull("emb/C1", []uint64{40, 10, 30, 20}, out)
	if err := ts.Advance(1, nil); err != nil {
		t.Fatal(err)
	}
	_ = ts.Pull("emb/C1", []uint64{10, 20}, out[:4]) // seen at 1
	if err := ts.Advance(2, nil); err != nil {       // 30 and 40 unseen for 2 steps: evicted
		t.Fatal(err)
	}
	_ = ts.Pull("emb/C1", []uint64{50, 40}, out[:4]) // into the freed slots
	if _, err := ts.Push(0, 2, "emb/C1", []uint64{50}, []float32{1, 2}); err != nil {
		t.Fatal(err)
	}
	got, want := ts.Snapshot()[0], shardckpt.CopyRows(ts.Table("emb/C1"))
	if !slices.Equal(got.Keys, []uint64{10, 20, 40, 50}) || !slices.Equal(got.Keys, want.Keys) ||
		!slices.Equal(got.Values, want.Values) || !slices.Equal(got.State, want.State) {
		t.Fatalf("snapshot %+v, want %+v", got, want)
	}
}

// A checkpoint's rows read from frozen slots while the table goes on
// training and growing are the rows of the moment of the freeze, and
// their file is byte for byte the one of a copy of them taken then.
func TestCheckpointOfFrozenSlotsIsTheFreezesRows(t *testing.T) {
	cfg := []embed.TableConfig{{Name: "emb/C1", Dim: 2, Seed: 1, Rule: embed.DefaultAdagrad(0.1), EvictAfter: 1}}
	ts := newTableSets(t, cfg, config.Async, 1)[0]
	keys := make([]uint64, 3000) // three blocks
	for i := range keys {
		keys[i] = uint64(len(keys) - i)
	}
	out := make([]float32, 2*len(keys))
	_ = ts.Pull("emb/C1", keys, out)
	if _, err := ts.Push(0, 0, "emb/C1", keys[:2], []float32{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	want := shardckpt.CopyRows(ts.Table("emb/C1"))
	slots := ts.FreezeSlots(nil)
	grads := make([]float32, len(out))
	for i := range grads {
		grads[i] = 0.25
	}
	if _, err := ts.Push(0, 0, "emb/C1", keys, grads); err != nil { // every block written
		t.Fatal(err)
	}
	_ = ts.Pull("emb/C1", []uint64{99999}, out[:2])
	encode := func(tensors []checkpoint.Tensor, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if _, err := checkpoint.WriteSafetensors(&b, tensors, nil); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	got := encode(shardckpt.SourceTensors(slotSources(slots)))
	if !bytes.Equal(got, encode(shardckpt.TableTensors([]shardckpt.TableRows{want}))) {
		t.Fatal("the checkpoint of the frozen slots differs from the rows copied at the freeze")
	}
	if now := shardckpt.CopyRows(ts.Table("emb/C1")); slices.Equal(now.Values, want.Values) {
		t.Fatal("the table did not change after the freeze: the test tests nothing")
	}
}

// TestSyncStepsReuseNoGradientOfTheStepBefore: the staged rows and the
// sum a step reuses carry nothing into the next step: a step after one
// where two workers pushed two keys applies only what its own pushes
// staged (one worker, one key), and a key no one pushed stays put.
func TestSyncStepsReuseNoGradientOfTheStepBefore(t *testing.T) {
	cfg := []embed.TableConfig{{Name: "emb/C1", Dim: 1, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}}
	ts := newTableSets(t, cfg, config.Sync, 1)[0]
	row := make([]float32, 2)
	if err := ts.Pull("emb/C1", []uint64{7, 8}, row); err != nil {
		t.Fatal(err)
	}
	init7, init8 := row[0], row[1]
	for w, g := range [][]float32{{2, 10}, {4, 20}} {
		if _, err := ts.Push(w, 0, "emb/C1", []uint64{7, 8}, g); err != nil {
			t.Fatal(err)
		}
	}
	if err := ts.Advance(1, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Push(1, 1, "emb/C1", []uint64{7}, []float32{6}); err != nil {
		t.Fatal(err)
	}
	if err := ts.Advance(2, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	// Step 1: 7 by mean(2, 4), 8 by mean(10, 20); step 2: 7 by 6 / 2
	// (worker 0 pushed nothing).
	got7, _, _ := ts.Table("emb/C1").Row(7)
	got8, _, _ := ts.Table("emb/C1").Row(8)
	if got7[0] != init7-3-3 || got8[0] != init8-15 {
		t.Fatalf("rows 7, 8 = %v, %v; want %v, %v", got7[0], got8[0], init7-6, init8-15)
	}
}
