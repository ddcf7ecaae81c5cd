package ps

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/config"
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
