package ps

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
)

// TestSyncStepsWithPullSlotsTrainAsWithout: workers' pulls keep the
// slots they found, and the step's end applies the gradients through
// them (embed.Table.PushHinted); the tables train bit for bit as those
// of the same steps whose pulls name no worker, whose end looks every
// key up. The steps' keys overlap between workers, each worker pushes
// in two requests, one of them in another order than it pulled (its
// hints then miss and are looked up), and eviction every 4 steps drops
// rows between steps; with rows at first touch and after 2 sightings.
func TestSyncStepsWithPullSlotsTrainAsWithout(t *testing.T) {
	for _, admit := range []int{0, 2} {
		syncStepsWithAndWithoutSlots(t, admit)
	}
}

func syncStepsWithAndWithoutSlots(t *testing.T, admit int) {
	cfgs := tableCfgs(admit, 4)
	hinted, plain := newTableSets(t, cfgs, config.Sync, 1)[0], newTableSets(t, cfgs, config.Sync, 1)[0]
	rng := rand.New(rand.NewPCG(7, 8))
	for step := range int64(12) {
		for _, c := range cfgs {
			for w := range 2 {
				seen := map[uint64]bool{}
				var keys []uint64
				for range 20 {
					if k := uint64(rng.IntN(40)); !seen[k] {
						seen[k] = true
						keys = append(keys, k)
					}
				}
				rows := make([]float32, len(keys)*c.Dim)
				if err := hinted.PullBlocks(w, []RowBlock{{Table: c.Name, Keys: keys, Values: rows}}); err != nil {
					t.Fatal(err)
				}
				if err := plain.Pull(c.Name, keys, slices.Clone(rows)); err != nil {
					t.Fatal(err)
				}
				grads := make([]float32, len(rows))
				for i := range grads {
					grads[i] = float32(rng.NormFloat64())
				}
				half := len(keys) / 2
				if w == 1 { // (the second half first: hints out of place)
					half = len(keys) - half
					keys = append(slices.Clone(keys[half:]), keys[:half]...)
					grads = append(slices.Clone(grads[half*c.Dim:]), grads[:half*c.Dim]...)
					half = len(keys) - half
				}
				for _, set := range []*TableSet{hinted, plain} {
					for _, part := range [][2]int{{0, half}, {half, len(keys)}} {
						if _, err := set.Push(w, step, c.Name, keys[part[0]:part[1]], grads[part[0]*c.Dim:part[1]*c.Dim]); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
		for _, set := range []*TableSet{hinted, plain} {
			if err := set.Advance(step+1, []int{0, 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range cfgs {
		a, b := hinted.Table(c.Name), plain.Table(c.Name)
		if a.Hinted() == 0 || b.Hinted() != 0 {
			t.Fatalf("admit %d, %s: %d keys applied through their pulls' slots, %d without slots; want some, and none", admit, c.Name, a.Hinted(), b.Hinted())
		}
		if !slices.Equal(a.Keys(), b.Keys()) || a.Stats() != b.Stats() {
			t.Fatalf("admit %d, %s: keys %v (%+v) against %v (%+v)", admit, c.Name, a.Keys(), a.Stats(), b.Keys(), b.Stats())
		}
		for _, k := range a.Keys() {
			ra, sa, _ := a.Row(k)
			rb, sb, _ := b.Row(k)
			if !slices.Equal(ra, rb) || !slices.Equal(sa, sb) {
				t.Fatalf("admit %d, %s key %d: row %v state %v, without slots %v %v", admit, c.Name, k, ra, sa, rb, sb)
			}
		}
	}
}

// TestSlotsOfAStepDoNotOutliveIt: the slots a pull found are kept for
// its own step only. Rows pulled at step 0 are all evicted by step 4;
// a pull then of the first key, whose freed slot's record still holds
// it, creates its row elsewhere, and the step trains that one as a set
// looking every key up does.
func TestSlotsOfAStepDoNotOutliveIt(t *testing.T) {
	cfgs := []embed.TableConfig{{Name: "emb/C1", Dim: 2, Seed: 3, Rule: embed.Rule{Kind: embed.SGD, LR: 1}, EvictAfter: 1}}
	hinted, plain := newTableSets(t, cfgs, config.Sync, 1)[0], newTableSets(t, cfgs, config.Sync, 1)[0]
	step := func(v int64, keys []uint64) {
		t.Helper()
		rows := make([]float32, 2*len(keys))
		if err := hinted.PullBlocks(0, []RowBlock{{Table: "emb/C1", Keys: keys, Values: rows}}); err != nil {
			t.Fatal(err)
		}
		if err := plain.Pull("emb/C1", keys, slices.Clone(rows)); err != nil {
			t.Fatal(err)
		}
		ones := make([]float32, len(rows))
		for i := range ones {
			ones[i] = 1
		}
		for _, set := range []*TableSet{hinted, plain} {
			if _, err := set.Push(0, v, "emb/C1", keys, ones); err != nil {
				t.Fatal(err)
			}
			if err := set.Advance(v+1, []int{0}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var first []uint64
	for k := uint64(1); k <= 50; k++ {
		first = append(first, k)
	}
	step(0, first)
	for v := int64(1); v < 4; v++ {
		step(v, []uint64{1000})
	}
	if n := hinted.Table("emb/C1").Stats().Evictions; n != 50 {
		t.Fatalf("%d rows evicted, want the step 0's 50", n)
	}
	step(4, []uint64{1})
	a, _, _ := hinted.Table("emb/C1").Row(1)
	b, _, _ := plain.Table("emb/C1").Row(1)
	if !slices.Equal(a, b) || hinted.Table("emb/C1").Stats() != plain.Table("emb/C1").Stats() {
		t.Fatalf("key 1's row %v (%+v), without slots %v (%+v)", a, hinted.Table("emb/C1").Stats(), b, plain.Table("emb/C1").Stats())
	}
}

// TestAKeptSetTrainsSync: a shard that keeps its rows over a change of
// layout (TableSet.Keep) serves a sync step's pulls and pushes, as a
// set that did not change does.
func TestAKeptSetTrainsSync(t *testing.T) {
	cfgs := tableCfgs(0, 0)
	old := newTableSets(t, cfgs, config.Sync, 1)[0]
	keys := []uint64{1, 2, 3, 4, 5, 6}
	if err := old.PullBlocks(0, []RowBlock{{Table: "emb/C1", Keys: keys, Values: make([]float32, 4*len(keys))}}); err != nil {
		t.Fatal(err)
	}
	like := newTableSets(t, cfgs, config.Sync, 2)[0]
	kept := old.Keep(like)
	if kept == nil {
		t.Fatal("Keep refused a set of its shard and tables")
	}
	mine := keys[:0:0]
	for _, k := range keys {
		if embed.ShardOf("emb/C1", k, 2) == 0 {
			mine = append(mine, k)
		}
	}
	rows := make([]float32, 4*len(mine))
	if err := kept.PullBlocks(0, []RowBlock{{Table: "emb/C1", Keys: mine, Values: rows}}); err != nil {
		t.Fatal(err)
	}
	if _, err := kept.Push(0, 0, "emb/C1", mine, rows); err != nil {
		t.Fatal(err)
	}
	if err := kept.Advance(1, []int{0}); err != nil {
		t.Fatal(err)
	}
	if got := kept.Table("emb/C1").Len(); got != len(mine) {
		t.Fatalf("the kept set holds %d rows, want its shard's %d", got, len(mine))
	}
}

// TestAStepAppliesThroughItsPullsSlots: a sync step whose pushes come in
// the order of their pull applies every key through the slot the pull
// found, without the index; pushed in another order, the keys are
// looked up (a slot is a position's hint, checked against its key).
func TestAStepAppliesThroughItsPullsSlots(t *testing.T) {
	cfgs := tableCfgs(0, 0)[:1]
	c := cfgs[0]
	ts := newTableSets(t, cfgs, config.Sync, 1)[0]
	keys := []uint64{5, 9, 2, 40, 7, 11}
	backward := slices.Clone(keys)
	slices.Reverse(backward)
	for step, order := range [][]uint64{keys, backward} {
		rows := make([]float32, len(keys)*c.Dim)
		if err := ts.PullBlocks(0, []RowBlock{{Table: c.Name, Keys: keys, Values: rows}}); err != nil {
			t.Fatal(err)
		}
		if _, err := ts.Push(0, int64(step), c.Name, order, make([]float32, len(rows))); err != nil {
			t.Fatal(err)
		}
		before := ts.Table(c.Name).Hinted()
		if err := ts.Advance(int64(step)+1, []int{0}); err != nil {
			t.Fatal(err)
		}
		want := int64(len(keys))
		if step == 1 {
			want = 0
		}
		if got := ts.Table(c.Name).Hinted() - before; got != want {
			t.Errorf("step %d: %d keys applied through their slots, want %d", step, got, want)
		}
	}
}

// TestAStepWithAdmissionAppliesThroughTheFirstPullsSlots: with an
// admission filter only a step's first pull of a key sights it (and
// finds its slot); when that was a later worker's, the step's end still
// applies through it. Keys admitted after 2 sightings: step 0 sights
// them once, step 1 creates their rows.
func TestAStepWithAdmissionAppliesThroughTheFirstPullsSlots(t *testing.T) {
	cfgs := tableCfgs(2, 0)[:1]
	c := cfgs[0]
	ts := newTableSets(t, cfgs, config.Sync, 1)[0]
	keys := []uint64{5, 9, 2, 40}
	rows := make([]float32, len(keys)*c.Dim)
	for step := range int64(2) {
		for _, w := range []int{1, 0} { // worker 1 pulls first
			if err := ts.PullBlocks(w, []RowBlock{{Table: c.Name, Keys: keys, Values: rows}}); err != nil {
				t.Fatal(err)
			}
		}
		for w := range 2 {
			if _, err := ts.Push(w, step, c.Name, keys, make([]float32, len(rows))); err != nil {
				t.Fatal(err)
			}
		}
		if err := ts.Advance(step+1, []int{0, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if rows := ts.Table(c.Name).Stats().Rows; rows != len(keys) {
		t.Fatalf("%d rows after two steps, want %d: the test's admission is not what it means", rows, len(keys))
	}
	if got := ts.Table(c.Name).Hinted(); got != int64(len(keys)) {
		t.Errorf("%d keys applied through their slots, want %d", got, len(keys))
	}
}
