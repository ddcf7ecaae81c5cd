package partition

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/ml/model"
)

func TestWeightedCoversEveryRowOnceInProportion(t *testing.T) {
	specs := []model.Spec{
		{Input: 784, Hidden: []int{800}, Classes: 10},
		{Input: 784, Hidden: []int{256, 128}, Classes: 10},
	}
	weights := [][]int{{1, 1}, {331, 669}, {1, 2, 3}, {700, 100, 100, 100}, {5, 1, 5}}
	for _, spec := range specs {
		for _, w := range weights {
			p, err := Weighted(spec, w)
			if err != nil {
				t.Fatalf("%s weighted %v: %v", spec, w, err)
			}
			checkCoverage(t, spec, p)
			sum, total := 0, spec.NumParams()
			for _, x := range w {
				sum += x
			}
			widest := 0
			for _, v := range p.Vars {
				widest = max(widest, v.Cols)
			}
			// Each cut is within one row of its share, so a shard is
			// within two rows of it.
			for s, sh := range p.Shards {
				want := float64(total) * float64(w[s]) / float64(sum)
				if d := math.Abs(float64(sh.Size) - want); d > float64(2*widest) {
					t.Errorf("%s weighted %v: shard %d holds %d, its share is %.0f (off by %.0f, more than two rows of %d)", spec, w, s, sh.Size, want, d, widest)
				}
			}
		}
	}
}

func TestEqualWeightsAreNew(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	for n := 1; n <= 5; n++ {
		even, _ := New(spec, n)
		w, err := Weighted(spec, slices.Repeat([]int{7}, n))
		if err != nil || !slices.Equal(sizes(w), sizes(even)) {
			t.Errorf("%d equal weights: sizes %v (%v), New's %v", n, sizes(w), err, sizes(even))
		}
		p, _ := LayoutOf(n, slices.Repeat([]int32{3}, n)).Plan(spec)
		if !slices.Equal(sizes(p), sizes(even)) || !LayoutOf(n, slices.Repeat([]int32{3}, n)).Equal(Even(n)) {
			t.Errorf("layout of %d equal weights is not the even one: %v", n, sizes(p))
		}
	}
	if _, err := Weighted(spec, []int{1, 0}); err == nil {
		t.Error("a zero weight was taken")
	}
	if _, err := (Layout{PS: 3, Weights: []int{1, 2}}).Plan(spec); err == nil {
		t.Error("two weights for three shards were taken")
	}
}

func TestWeightedIsDeterministicAndMovesRowsOffTheLightShard(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	a, _ := Weighted(spec, []int{250, 750})
	b, _ := Weighted(spec, []int{250, 750})
	if !slices.EqualFunc(a.Shards, b.Shards, func(x, y Shard) bool { return slices.Equal(x.Blocks, y.Blocks) }) {
		t.Fatal("the same weights gave two plans")
	}
	even, _ := New(spec, 2)
	moves := Moves(even, a)
	for _, m := range moves {
		if m.From != m.To && (m.From != 0 || m.To != 1) {
			t.Errorf("a move from shard %d to %d: only shard 0's excess should move, to shard 1", m.From, m.To)
		}
	}
	if got, want := MovedElements(moves), even.Shards[0].Size-a.Shards[0].Size; got != want {
		t.Errorf("moved %d elements, shard 0 shrank by %d", got, want)
	}
}

func TestPlanRebalance(t *testing.T) {
	// ps/0 takes 3x as long per gradient as ps/1 for the same parameters:
	// its speed is a third of ps/1's, its weight a quarter of the whole.
	loads := []Load{{Params: 318010, Pushes: 100, Seconds: 0.3}, {Params: 318000, Pushes: 100, Seconds: 0.1}}
	r, err := PlanRebalance(loads, MinImbalance)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Weights, []int{250, 750}) || math.Abs(r.Imbalance-3) > 1e-9 {
		t.Errorf("weights %v imbalance %.3f, want [250 750] and 3", r.Weights, r.Imbalance)
	}
	// Measured on that layout, the shards take as long: balanced.
	after := []Load{{Params: 159000, Pushes: 100, Seconds: 0.15}, {Params: 477010, Pushes: 100, Seconds: 0.15}}
	if _, err := PlanRebalance(after, MinImbalance); !errors.Is(err, ErrBalanced) {
		t.Errorf("even times: %v, want ErrBalanced", err)
	}
	few := []Load{{Params: 1, Pushes: MinPushes - 1, Seconds: 1}, {Params: 1, Pushes: 100, Seconds: 0.1}}
	if _, err := PlanRebalance(few, MinImbalance); !errors.Is(err, ErrUnmeasured) {
		t.Errorf("too few pushes: %v, want ErrUnmeasured", err)
	}
	if _, err := PlanRebalance(loads[:1], MinImbalance); !errors.Is(err, ErrBalanced) {
		t.Errorf("one shard: %v, want ErrBalanced", err)
	}
	// A tiny speed still gets a tenth of an even share.
	tiny := []Load{{Params: 1000, Pushes: 100, Seconds: 1000}, {Params: 1000, Pushes: 100, Seconds: 0.001}}
	if r, err := PlanRebalance(tiny, MinImbalance); err != nil || r.Weights[0] != WeightScale/20 {
		t.Errorf("tiny speed: %v %v, want weight %d for ps/0", r.Weights, err, WeightScale/20)
	}
}

// TestLayoutWeights: weights name one plan whatever their common factor,
// equal ones are even, and the plan refuses weights out of [1,
// MaxWeight] (a message or a manifest could carry any).
func TestLayoutWeights(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	if a, b := LayoutOf(2, []int{1, 2}), LayoutOf(2, []int32{2, 4}); !a.Equal(b) || b.String() != "2 weighted 2:4" {
		t.Errorf("1:2 and 2:4: %v and %v, want one layout, its weights kept as given", a, b)
	}
	if a, b := LayoutOf(2, []int{1, 2}), LayoutOf(2, []int{2, 1}); a.Equal(b) || a.Equal(Even(2)) {
		t.Errorf("1:2 equal to 2:1 or to even")
	}
	if l := LayoutOf(3, []int{7, 7, 7}); !l.Equal(Even(3)) || l.Weights32() != nil {
		t.Errorf("7:7:7 is %v, want even", l)
	}
	for _, w := range [][]int{{0, 1}, {-1, 2}, {MaxWeight + 1, 1}, {1 << 40, 1}} {
		if _, err := LayoutOf(2, w).Plan(spec); err == nil {
			t.Errorf("weights %v: a plan, want an error", w)
		}
	}
	if _, err := LayoutOf(2, []int{MaxWeight, MaxWeight - 1}).Plan(spec); err != nil {
		t.Errorf("weights at the bound: %v", err)
	}
}
