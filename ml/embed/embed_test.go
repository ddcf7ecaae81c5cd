package embed

import (
	"math"
	"math/bits"
	"slices"
	"testing"
)

func TestInitRowIsAFunctionOfSeedTableAndKey(t *testing.T) {
	a, b := make([]float32, 16), make([]float32, 16)
	InitRow(7, "emb/C1", 42, a)
	InitRow(7, "emb/C1", 42, b)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, table and key gave %v and %v", a, b)
	}
	bound := float32(1 / math.Sqrt(16))
	for _, v := range a {
		if v < -bound || v >= bound {
			t.Fatalf("value %v outside [-%v, %v)", v, bound, bound)
		}
	}
	for _, other := range []struct {
		seed  uint64
		table string
		key   uint64
	}{{8, "emb/C1", 42}, {7, "emb/C2", 42}, {7, "emb/C1", 43}} {
		InitRow(other.seed, other.table, other.key, b)
		if slices.Equal(a, b) {
			t.Errorf("%+v gave the same row as seed 7, emb/C1, key 42", other)
		}
	}
}

func TestInitRowHasZeroMeanAndTheUniformSpread(t *testing.T) {
	const dim, rows = 8, 20000
	row := make([]float32, dim)
	var sum, sq float64
	for k := uint64(0); k < rows; k++ {
		InitRow(1, "t", k, row)
		for _, v := range row {
			sum += float64(v)
			sq += float64(v) * float64(v)
		}
	}
	n := float64(dim * rows)
	mean, variance := sum/n, sq/n-(sum/n)*(sum/n)
	want := 1.0 / dim / 3 // uniform on [-a, a): a^2/3, a^2 = 1/dim
	if math.Abs(mean) > 0.005 || math.Abs(variance-want) > 0.02*want {
		t.Fatalf("mean %.4f variance %.5f, want ~0 and %.5f", mean, variance, want)
	}
}

func TestShardOfSpreadsKeysEvenly(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 7} {
		counts := make([]int, n)
		const keys = 70000
		for k := uint64(0); k < keys; k++ {
			s := ShardOf("emb/C3", k, n)
			if s < 0 || s >= n {
				t.Fatalf("ShardOf(k=%d, n=%d) = %d", k, n, s)
			}
			counts[s]++
		}
		mean := float64(keys) / float64(n)
		for s, c := range counts {
			if math.Abs(float64(c)-mean) > 0.03*mean {
				t.Errorf("n=%d: shard %d holds %d keys, mean %.0f", n, s, c, mean)
			}
		}
	}
}

func TestDedupAndCombineSumDuplicateKeys(t *testing.T) {
	var d Deduper
	keys := []uint64{5, 9, 5, 1, 9, 5}
	uniq, index := d.Dedup(keys, nil, nil)
	if !slices.Equal(uniq, []uint64{5, 9, 1}) || !slices.Equal(index, []int32{0, 1, 0, 2, 1, 0}) {
		t.Fatalf("Dedup = %v %v", uniq, index)
	}
	grads := []float32{1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60}
	out := make([]float32, len(uniq)*2)
	if err := Combine(index, 2, grads, out); err != nil {
		t.Fatal(err)
	}
	if want := []float32{1 + 3 + 6, 10 + 30 + 60, 2 + 5, 20 + 50, 4, 40}; !slices.Equal(out, want) {
		t.Fatalf("Combine = %v, want %v", out, want)
	}
	// The deduper starts afresh on the next batch.
	uniq, index = d.Dedup([]uint64{9}, uniq, index)
	if !slices.Equal(uniq, []uint64{9}) || !slices.Equal(index, []int32{0}) {
		t.Fatalf("second batch: %v %v", uniq, index)
	}
	if err := Combine([]int32{0, 3}, 2, make([]float32, 4), make([]float32, 4)); err == nil {
		t.Fatal("Combine accepted an index beyond the output")
	}
	if err := Combine([]int32{0}, 2, make([]float32, 3), make([]float32, 2)); err == nil {
		t.Fatal("Combine accepted a gradient of the wrong length")
	}
}

func TestRulesUpdateARowAsWritten(t *testing.T) {
	grad := []float32{1, -2}
	sgd := Rule{Kind: SGD, LR: 0.5}
	row := []float32{1, 1}
	if err := sgd.Apply(row, nil, grad); err != nil || !slices.Equal(row, []float32{0.5, 2}) {
		t.Fatalf("sgd: %v %v", row, err)
	}
	mom := Rule{Kind: Momentum, LR: 0.5, Momentum: 0.9}
	row, state := []float32{0, 0}, make([]float32, 2)
	mom.InitState(state)
	_ = mom.Apply(row, state, grad)
	_ = mom.Apply(row, state, grad)
	// velocity 1 then 1.9: row = -0.5*(1+1.9)
	if math.Abs(float64(row[0]+1.45)) > 1e-6 || math.Abs(float64(row[1]-2.9)) > 1e-6 {
		t.Fatalf("momentum: %v", row)
	}
	ada := DefaultAdagrad(0.1)
	row, state = []float32{0, 0}, make([]float32, 2)
	ada.InitState(state)
	if state[0] != 0.1 {
		t.Fatalf("adagrad state starts at %v", state[0])
	}
	_ = ada.Apply(row, state, grad)
	want0 := -0.1 * 1 / (math.Sqrt(1.1) + 1e-7)
	want1 := -0.1 * -2 / (math.Sqrt(4.1) + 1e-7)
	if math.Abs(float64(row[0])-want0) > 1e-6 || math.Abs(float64(row[1])-want1) > 1e-6 {
		t.Fatalf("adagrad: %v, want [%v %v]", row, want0, want1)
	}
	if err := ada.Apply(row, nil, grad); err == nil {
		t.Fatal("adagrad accepted a row without state")
	}
}

func TestRuleValidate(t *testing.T) {
	for _, bad := range []Rule{
		{Kind: SGD}, {Kind: "adam", LR: 1}, {Kind: Momentum, LR: 1, Momentum: 1},
		{Kind: Adagrad, LR: 1}, {Kind: SGD, LR: float32(math.Inf(1))},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	for _, good := range []Rule{{Kind: SGD, LR: 0.1}, {Kind: Momentum, LR: 0.1, Momentum: 0.9}, DefaultAdagrad(0.05)} {
		if err := good.Validate(); err != nil {
			t.Errorf("%+v: %v", good, err)
		}
	}
}

// TestPlacerIsKeyHashsRange: a Placer puts a key where the high word of
// KeyHash times n says (the placement checkpoints and resharding rely
// on), for every shard count.
func TestPlacerIsKeyHashsRange(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7} {
		p := PlacerOf("emb/C7", n)
		for k := uint64(0); k < 5000; k += 7 {
			hi, _ := bits.Mul64(KeyHash("emb/C7", k), uint64(n))
			if got := p.Shard(k); got != int(hi) || got != ShardOf("emb/C7", k, n) {
				t.Fatalf("key %d of %d shards: Placer %d, ShardOf %d, KeyHash's range %d", k, n, got, ShardOf("emb/C7", k, n), hi)
			}
		}
	}
}

// TestShardsMeetIsWhereKeysGo: for every pair of counts to 6, every key
// of shard j of from that ShardOf puts on shard s of to has the two
// shards meeting, and shards that meet share some key.
func TestShardsMeetIsWhereKeysGo(t *testing.T) {
	for from := 1; from <= 6; from++ {
		for to := 1; to <= 6; to++ {
			shared := map[[2]int]bool{}
			for k := uint64(0); k < 20000; k++ {
				j, s := ShardOf("emb/C1", k, from), ShardOf("emb/C1", k, to)
				shared[[2]int{j, s}] = true
				if !ShardsMeet(j, from, s, to) {
					t.Fatalf("key %d: shard %d of %d and shard %d of %d hold it, ShardsMeet says they cannot", k, j, from, s, to)
				}
			}
			for j := range from {
				for s := range to {
					if ShardsMeet(j, from, s, to) && !shared[[2]int{j, s}] {
						t.Errorf("shard %d of %d and %d of %d meet, but no key of 20,000 is on both", j, from, s, to)
					}
				}
			}
		}
	}
}
