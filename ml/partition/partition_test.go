package partition

import (
	"slices"
	"testing"

	"github.com/pstrain/pstrain/ml/model"
)

func TestBalancedWithinFivePercent(t *testing.T) {
	specs := []model.Spec{
		{Input: 784, Hidden: []int{800}, Classes: 10},
		{Input: 784, Hidden: []int{256, 128}, Classes: 10},
		{Input: 784, Hidden: []int{1024, 1024, 512}, Classes: 47},
	}
	for _, spec := range specs {
		for n := 1; n <= 8; n++ {
			p, err := New(spec, n)
			if err != nil {
				t.Fatalf("%s on %d shards: %v", spec, n, err)
			}
			if im := p.Imbalance(); im > 0.05 {
				t.Errorf("%s on %d shards: imbalance %.3f > 5%% (sizes %v)", spec, n, im, sizes(p))
			}
			checkCoverage(t, spec, p)
		}
	}
}

func sizes(p Plan) []int {
	var out []int
	for _, s := range p.Shards {
		out = append(out, s.Size)
	}
	return out
}

// checkCoverage asserts every element of every variable is on exactly one
// shard, via a Gather/Scatter round trip.
func checkCoverage(t *testing.T, spec model.Spec, p Plan) {
	t.Helper()
	vars := spec.Init(1)
	seen := make([][]int, len(vars))
	for i := range vars {
		seen[i] = make([]int, len(vars[i]))
	}
	total := 0
	for s, sh := range p.Shards {
		total += sh.Size
		for _, b := range sh.Blocks {
			cols := p.Vars[b.Var].Cols
			for j := b.RowStart * cols; j < b.RowEnd*cols; j++ {
				seen[b.Var][j]++
			}
		}
		buf := make([]float32, sh.Size)
		p.Gather(s, vars, buf)
		out := make([][]float32, len(vars))
		for i := range vars {
			out[i] = make([]float32, len(vars[i]))
		}
		p.Scatter(s, buf, out)
		for _, b := range sh.Blocks {
			cols := p.Vars[b.Var].Cols
			for j := b.RowStart * cols; j < b.RowEnd*cols; j++ {
				if out[b.Var][j] != vars[b.Var][j] {
					t.Fatalf("shard %d: gather/scatter lost var %d elem %d", s, b.Var, j)
				}
			}
		}
	}
	if total != spec.NumParams() {
		t.Fatalf("shards hold %d elements, model has %d", total, spec.NumParams())
	}
	for i := range seen {
		for j, c := range seen[i] {
			if c != 1 {
				t.Fatalf("var %d elem %d placed %d times", i, j, c)
			}
		}
	}
}

func TestBigMatrixIsSplitAndNoShardIsOnlyBiases(t *testing.T) {
	spec := model.Spec{Input: 784, Hidden: []int{800}, Classes: 10}
	p, err := New(spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	for s, sh := range p.Shards {
		if sh.Blocks[0].Var != 0 {
			t.Errorf("shard %d does not start with a block of the 784x800 matrix: %+v", s, sh.Blocks)
		}
	}
}

func TestTooManyShardsIsAClearError(t *testing.T) {
	if _, err := New(model.Spec{Input: 2, Classes: 2}, 4); err == nil {
		t.Fatal("a 2x2 model on 4 shards should be refused")
	}
	if _, err := New(model.Spec{Input: 2, Classes: 2}, 0); err == nil {
		t.Fatal("0 shards should be refused")
	}
}

// A plan's shard count and the model's size are bounded before the plan
// is built: a PS builds one from an Init's, which may be garbage.
func TestShardsAndParamsBounded(t *testing.T) {
	wide := model.Spec{Input: 2 * MaxShards, Classes: 2} // rows enough for every shard
	if _, err := New(wide, MaxShards); err != nil {
		t.Fatalf("%d shards: %v", MaxShards, err)
	}
	for _, n := range []int{MaxShards + 1, 1<<31 - 1} {
		if _, err := New(wide, n); err == nil {
			t.Fatalf("%d shards accepted", n)
		}
	}
	weights := make([]int, MaxShards+1)
	for i := range weights {
		weights[i] = 1 + i%2
	}
	if _, err := LayoutOf(len(weights), weights).Plan(wide); err == nil {
		t.Fatalf("a weighted layout of %d shards accepted", len(weights))
	}
	for _, spec := range []model.Spec{
		{Input: 1 << 20, Hidden: []int{1 << 11, 1}, Classes: 2}, // 2^31 + 2^11 + ... parameters
		{Input: 1<<31 - 1, Hidden: []int{1<<31 - 1, 1<<31 - 1}, Classes: 2},
	} {
		if _, err := New(spec, 1); err == nil {
			t.Fatalf("%v: more than %d parameters accepted", spec, MaxParams)
		}
	}
	if _, err := New(model.Spec{Input: 1 << 20, Hidden: []int{1<<11 - 2}, Classes: 2}, 1); err != nil {
		t.Fatalf("a model just below %d parameters: %v", MaxParams, err)
	}
}

func TestSegmentsMatchGather(t *testing.T) {
	spec := model.Spec{Input: 30, Hidden: []int{20, 7}, Classes: 5}
	vars := spec.Init(2)
	for _, n := range []int{1, 2, 3} {
		p, err := New(spec, n)
		if err != nil {
			t.Fatal(err)
		}
		for s := range p.Shards {
			want := make([]float32, p.Shards[s].Size)
			p.Gather(s, vars, want)
			var got []float32
			for _, seg := range p.Segments(s, vars) {
				got = append(got, seg...)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%d shards, shard %d: segments differ from Gather", n, s)
			}
		}
	}
}

// A CNN's kernels are one row per output channel, so the row cuts (block
// boundaries) shard them by output channel; the default CNN (and the wider ones the flags
// allow) splits within 5% on 1-4 parameter servers.
func TestCNNBalancedByOutputChannel(t *testing.T) {
	cnn := func(conv []int, hidden int) model.Spec {
		return model.Spec{Kind: model.KindCNN, Input: 784, Height: 28, Width: 28, Conv: conv, Hidden: []int{hidden}, Classes: 10}
	}
	for _, spec := range []model.Spec{cnn([]int{16, 32}, 256), cnn([]int{32, 64}, 512), cnn([]int{6, 16}, 120)} {
		for n := 1; n <= 4; n++ {
			p, err := New(spec, n)
			if err != nil {
				t.Fatalf("%s on %d shards: %v", spec, n, err)
			}
			if im := p.Imbalance(); im > 0.05 {
				t.Errorf("%s on %d shards: imbalance %.3f > 5%% (sizes %v)", spec, n, im, sizes(p))
			}
			checkCoverage(t, spec, p)
		}
	}
}

// A kernel bigger than a shard's share is cut between output channels:
// with 3 shards of a CNN whose second kernel holds most of the bytes,
// that kernel spans shards and every piece is a channel range.
func TestCNNKernelSplitAcrossShards(t *testing.T) {
	spec := model.Spec{Kind: model.KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{8, 64}, Hidden: []int{16}, Classes: 10}
	p, err := New(spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	var holders []int
	channels := 0
	for s, sh := range p.Shards {
		for _, b := range sh.Blocks {
			if p.Vars[b.Var].Name == "conv1/w" {
				holders = append(holders, s)
				channels += b.RowEnd - b.RowStart
			}
		}
	}
	if len(holders) < 2 || channels != 64 {
		t.Fatalf("conv1/w (64 channels, %d of %d elements) on shards %v covering %d channels; sizes %v",
			p.Vars[2].Size(), spec.NumParams(), holders, channels, sizes(p))
	}
	if im := p.Imbalance(); im > 0.05 {
		t.Errorf("imbalance %.3f (sizes %v)", im, sizes(p))
	}
}
