package ps

import (
	"math"
	"reflect"
	"testing"

	"github.com/pstrain/pstrain/config"
)

// answer is what a pull of a shard in generation g at version v says.
func answer(v, g int64) PullView { return PullView{Version: v, Generation: g} }

func doneAnswer(v PullView) PullView    { v.Done = true; return v }
func stalledAnswer(v PullView) PullView { v.Stalled = true; return v }

func TestAlign(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  config.Mode
		views []PullView
		want  Alignment
	}{
		{"all equal", config.Sync, []PullView{answer(7, 1), answer(7, 1), answer(7, 1)},
			Alignment{Action: AlignStep, Version: 7}},
		{"one shard", config.Sync, []PullView{answer(3, 2)},
			Alignment{Action: AlignStep, Version: 3}},
		{"one behind: pulled again at the highest version, bounded", config.Sync, []PullView{answer(8, 1), answer(7, 1), answer(8, 1)},
			Alignment{Action: AlignPull, Version: 8, Pulls: []Pull{{Shard: 1, MinVersion: 8, Bounded: true}}}},
		{"two behind", config.Sync, []PullView{answer(7, 1), answer(8, 1), answer(7, 1)},
			Alignment{Action: AlignPull, Version: 8, Pulls: []Pull{{Shard: 0, MinVersion: 8, Bounded: true}, {Shard: 2, MinVersion: 8, Bounded: true}}}},
		{"an older generation: pulled until it changes, unbounded", config.Sync, []PullView{answer(14, 1), answer(8, 2)},
			Alignment{Action: AlignPull, Version: 8, Pulls: []Pull{{Shard: 0, MinVersion: math.MaxInt64}}}},
		{"an older generation at a lower version", config.Sync, []PullView{answer(3, 1), answer(8, 2), answer(8, 2)},
			Alignment{Action: AlignPull, Version: 8, Pulls: []Pull{{Shard: 0, MinVersion: math.MaxInt64}}}},
		{"the newest generation's highest version counts, not an older one's", config.Sync, []PullView{answer(20, 1), answer(8, 2), answer(7, 2)},
			Alignment{Action: AlignPull, Version: 8, Pulls: []Pull{{Shard: 0, MinVersion: math.MaxInt64}, {Shard: 2, MinVersion: 8, Bounded: true}}}},
		{"generation 0 (a shard the chief never initialised in a generation)", config.Sync, []PullView{answer(0, 0), answer(0, 0)},
			Alignment{Action: AlignStep, Version: 0}},
		{"done on one shard ends the step", config.Sync, []PullView{answer(9, 1), doneAnswer(answer(10, 1))},
			Alignment{Action: AlignDone}},
		{"done beats a generation lag", config.Sync, []PullView{doneAnswer(answer(4, 1)), answer(2, 2)},
			Alignment{Action: AlignDone}},
		{"done beats a stalled shard", config.Sync, []PullView{stalledAnswer(answer(9, 1)), doneAnswer(answer(10, 1))},
			Alignment{Action: AlignDone}},
		{"stalled behind: catch up", config.Sync, []PullView{answer(8, 1), stalledAnswer(answer(7, 1))},
			Alignment{Action: AlignCatchUp, Version: 8, CatchUp: []int{1}}},
		{"two stalled: catch both up", config.Sync, []PullView{stalledAnswer(answer(7, 3)), answer(8, 3), stalledAnswer(answer(7, 3))},
			Alignment{Action: AlignCatchUp, Version: 8, CatchUp: []int{0, 2}}},
		{"stalled at the highest version is not behind", config.Sync, []PullView{stalledAnswer(answer(8, 1)), answer(8, 1)},
			Alignment{Action: AlignStep, Version: 8}},
		{"stalled during a rollback: pulled again, no catch-up", config.Sync, []PullView{answer(9, 1), stalledAnswer(answer(7, 2)), answer(8, 2)},
			Alignment{Action: AlignPull, Version: 8, Pulls: []Pull{{Shard: 0, MinVersion: math.MaxInt64}, {Shard: 1, MinVersion: 8, Bounded: true}}}},
		{"async: never pulled again", config.Async, []PullView{answer(120, 1), answer(97, 1), answer(3, 2)},
			Alignment{Action: AlignStep}},
		{"async: never caught up", config.Async, []PullView{answer(12, 1), stalledAnswer(answer(9, 1))},
			Alignment{Action: AlignStep}},
		{"async: done", config.Async, []PullView{answer(12, 1), doneAnswer(answer(9, 1))},
			Alignment{Action: AlignDone}},
		{"ssp: never pulled again", config.SSP, []PullView{answer(5, 1), answer(50, 1)},
			Alignment{Action: AlignStep}},
		{"ssp: never caught up", config.SSP, []PullView{stalledAnswer(answer(5, 1)), answer(50, 1)},
			Alignment{Action: AlignStep}},
		{"ssp: done", config.SSP, []PullView{doneAnswer(answer(5, 1)), answer(50, 1)},
			Alignment{Action: AlignDone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Align(tc.mode, tc.views); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Align(%s, %+v) =\n  %+v (%v), want\n  %+v (%v)", tc.mode, tc.views, got, got.Action, tc.want, tc.want.Action)
			}
		})
	}
}

// Align applied until it settles, with shards that answer at once (a
// bounded pull reaching its version in time): a sync step always ends on
// one version of every shard, in one generation.
func TestAlignSettles(t *testing.T) {
	// The shards' states; a pull answers with them.
	shards := []PullView{answer(5, 2), answer(6, 2), answer(9, 1)}
	views := []PullView{answer(5, 2), answer(6, 2), answer(9, 1)}
	for round := 0; ; round++ {
		if round > 3 {
			t.Fatal("no step after 3 rounds")
		}
		a := Align(config.Sync, views)
		if a.Action == AlignStep {
			for s, v := range views {
				if v.Version != a.Version || v.Generation != 2 {
					t.Fatalf("step at version %d with shard %d at %+v", a.Version, s, v)
				}
			}
			return
		}
		if a.Action != AlignPull {
			t.Fatalf("round %d: %v", round, a.Action)
		}
		for _, p := range a.Pulls {
			if p.MinVersion == math.MaxInt64 {
				shards[p.Shard] = answer(6, 2) // the rollback reaches it
			} else {
				shards[p.Shard].Version = max(shards[p.Shard].Version, p.MinVersion) // the push in flight arrives
			}
			views[p.Shard] = shards[p.Shard]
		}
	}
}
