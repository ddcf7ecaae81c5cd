package dataset

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func mustDataset(t testing.TB, n, rows, cols, classes int) *Dataset {
	t.Helper()
	img, err := ParseIDX(synthImages(n, rows, cols))
	if err != nil {
		t.Fatal(err)
	}
	lbl, err := ParseIDX(synthLabels(n, classes))
	if err != nil {
		t.Fatal(err)
	}
	ds, err := NewDataset(img, lbl)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

func TestNewDataset(t *testing.T) {
	ds := mustDataset(t, 6, 2, 3, 4)
	if ds.N != 6 || ds.Dim != 6 || ds.Classes != 4 || len(ds.Images) != 36 || len(ds.Labels) != 6 {
		t.Fatalf("got N=%d Dim=%d Classes=%d len=%d/%d", ds.N, ds.Dim, ds.Classes, len(ds.Images), len(ds.Labels))
	}
	for i := 0; i < ds.N; i++ {
		for p := 0; p < ds.Dim; p++ {
			want := float32(byte(i*7+p*3)) / 255
			if got := ds.Image(i)[p]; got != want {
				t.Fatalf("pixel %d of image %d = %v, want %v", p, i, got, want)
			}
		}
	}
	// Exact scaling at the ends of the range.
	img, _ := ParseIDX(idxBytes([]uint32{1, 1, 3}, []byte{0, 255, 51}))
	lbl, _ := ParseIDX(idxBytes([]uint32{1}, []byte{9}))
	ds, err := NewDataset(img, lbl)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ds.Images, []float32{0, 1, 0.2}) || ds.Classes != 10 {
		t.Errorf("images %v classes %d", ds.Images, ds.Classes)
	}
}

func TestNewDatasetErrors(t *testing.T) {
	img3, _ := ParseIDX(synthImages(3, 2, 2))
	lbl3, _ := ParseIDX(synthLabels(3, 2))
	lbl4, _ := ParseIDX(synthLabels(4, 2))
	noPix, _ := ParseIDX(idxBytes([]uint32{3, 0, 2}, nil))
	cases := []struct {
		name     string
		img, lbl *IDX
		want     string
	}{
		{"count mismatch", img3, lbl4, "3 images but 4 labels"},
		{"images as labels", img3, img3, "labels must have rank 1"},
		{"labels as images", lbl3, lbl3, "images must have rank 3"},
		{"no pixels", noPix, lbl3, "no pixels"},
	}
	for _, c := range cases {
		_, err := NewDataset(c.img, c.lbl)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrCorrupt containing %q", c.name, err, c.want)
		}
	}
}

func TestShard(t *testing.T) {
	for _, N := range []int{0, 1, 7, 10, 60} {
		ds := mustDataset(t, N, 2, 2, 10)
		for _, n := range []int{1, 2, 3, 7, 11} {
			next := 0
			minSize, maxSize := N, 0
			for i := 0; i < n; i++ {
				s := ds.Shard(i, n)
				minSize, maxSize = min(minSize, s.N), max(maxSize, s.N)
				if len(s.Labels) != s.N || len(s.Images) != s.N*s.Dim || s.Dim != ds.Dim || s.Classes != ds.Classes {
					t.Fatalf("N=%d shard %d/%d inconsistent: %+v", N, i, n, s)
				}
				for j := 0; j < s.N; j++ {
					if s.Labels[j] != ds.Labels[next+j] || s.Image(j)[1] != ds.Image(next + j)[1] {
						t.Fatalf("N=%d shard %d/%d sample %d is not sample %d", N, i, n, j, next+j)
					}
				}
				if s.N > 0 && &s.Labels[0] != &ds.Labels[next] {
					t.Errorf("shard does not share the backing array")
				}
				if cap(s.Labels) != s.N || cap(s.Images) != s.N*s.Dim {
					t.Errorf("shard capacity not clipped")
				}
				next += s.N
			}
			if next != N {
				t.Errorf("N=%d n=%d: shards cover %d samples", N, n, next)
			}
			if maxSize-minSize > 1 {
				t.Errorf("N=%d n=%d: shard sizes %d..%d", N, n, minSize, maxSize)
			}
		}
	}
	ds := mustDataset(t, 5, 1, 1, 2)
	mustPanic(t, "Shard(2,2)", func() { ds.Shard(2, 2) })
	mustPanic(t, "Shard(-1,2)", func() { ds.Shard(-1, 2) })
	mustPanic(t, "Shard(0,0)", func() { ds.Shard(0, 0) })
}

func TestSubsetSize(t *testing.T) {
	cases := []struct {
		f    float64
		n    int
		want int
	}{
		{1, 10, 10}, {0.5, 10, 5}, {0.55, 10, 6}, {0.07, 100, 7}, {0.1, 60000, 6000},
		{0.7, 10, 7}, {1e-12, 60000, 1}, {0.3, 0, 0}, {0.01, 150, 2}, {1.0 / 3, 3, 1},
	}
	for _, c := range cases {
		if got := SubsetSize(c.f, c.n); got != c.want {
			t.Errorf("SubsetSize(%v, %d) = %d, want %d", c.f, c.n, got, c.want)
		}
	}
}

func TestSubset(t *testing.T) {
	ds := mustDataset(t, 50, 2, 3, 7)
	a := ds.Subset(0.3, 5)
	b := ds.Subset(0.3, 5)
	if a.N != 15 || len(a.Labels) != 15 || len(a.Images) != 15*6 || a.Classes != 7 || a.Dim != 6 {
		t.Fatalf("subset N=%d", a.N)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("same seed, different subsets")
	}
	perm := Permutation(50, 5)
	for j := 0; j < a.N; j++ {
		src := perm[j]
		if a.Labels[j] != ds.Labels[src] || !slices.Equal(a.Image(j), ds.Image(src)) {
			t.Fatalf("sample %d is not source sample %d", j, src)
		}
	}
	if c := ds.Subset(0.3, 6); reflect.DeepEqual(a.Labels, c.Labels) && reflect.DeepEqual(a.Images, c.Images) {
		t.Errorf("different seeds, same subset")
	}
	// The subset is a copy.
	a.Images[0] = 42
	if ds.Images[perm[0]*6] == 42 {
		t.Errorf("subset aliases the source")
	}
	full := ds.Subset(1, 9)
	if full.N != 50 {
		t.Errorf("full subset has %d samples", full.N)
	}
	for _, f := range []float64{0, -0.5, 1.01} {
		mustPanic(t, "Subset", func() { ds.Subset(f, 1) })
	}
}

func TestPermutationGolden(t *testing.T) {
	s := splitMix64{state: 0}
	// Reference SplitMix64 outputs for seed 0.
	for _, want := range []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f} {
		if got := s.next(); got != want {
			t.Fatalf("splitmix64 = %#x, want %#x", got, want)
		}
	}
	// Pinned outputs: changing these breaks reproducibility of every
	// recorded run, so it must never happen silently.
	golden := []struct {
		n    int
		seed int64
		want []int
	}{
		{10, 42, []int{8, 3, 6, 5, 4, 0, 9, 2, 1, 7}},
		{10, -1, []int{6, 7, 0, 3, 5, 4, 2, 1, 9, 8}},
		{5, 0, []int{2, 3, 0, 1, 4}},
		{1, 3, []int{0}},
		{0, 3, []int{}},
	}
	for _, g := range golden {
		if got := Permutation(g.n, g.seed); !slices.Equal(got, g.want) {
			t.Errorf("Permutation(%d, %d) = %v, want %v", g.n, g.seed, got, g.want)
		}
	}
}

func TestPermutationIsUniform(t *testing.T) {
	// All 6 permutations of 3 elements, over 6000 seeds: each ~1000.
	counts := map[[3]int]int{}
	for seed := int64(0); seed < 6000; seed++ {
		p := Permutation(3, seed)
		counts[[3]int{p[0], p[1], p[2]}]++
	}
	if len(counts) != 6 {
		t.Fatalf("only %d distinct permutations", len(counts))
	}
	for p, c := range counts {
		if c < 850 || c > 1150 {
			t.Errorf("permutation %v seen %d times out of 6000", p, c)
		}
	}
	p := Permutation(1000, 77)
	s := slices.Clone(p)
	slices.Sort(s)
	for i, v := range s {
		if v != i {
			t.Fatalf("not a permutation")
		}
	}
}

// A Dataset held as stored (Pixels) has the samples of the same set held
// as float32 values, and so do its shards and subsets.
func TestStoredDataset(t *testing.T) {
	img, _ := ParseIDX(synthImages(17, 2, 3))
	lbl, _ := ParseIDX(synthLabels(17, 5))
	f, err := NewDataset(img, lbl)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newStoredDataset(img, lbl)
	if err != nil {
		t.Fatal(err)
	}
	if s.Images != nil || len(s.Pixels) != 17*6 || s.Classes != f.Classes {
		t.Fatalf("stored set: %d values, %d bytes, classes %d", len(s.Images), len(s.Pixels), s.Classes)
	}
	if !sameSamples(s, f) {
		t.Fatal("stored and float32 sets differ")
	}
	for i := 0; i < 3; i++ {
		if !sameSamples(s.Shard(i, 3), f.Shard(i, 3)) || s.Shard(i, 3).Pixels == nil {
			t.Errorf("shard %d of 3 differs", i)
		}
	}
	if !sameSamples(s.Subset(0.5, 4), f.Subset(0.5, 4)) {
		t.Error("subsets differ")
	}
	if _, err := newStoredDataset(img, lbl3(t)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("mismatched labels: err = %v", err)
	}
}

func lbl3(t *testing.T) *IDX {
	t.Helper()
	l, err := ParseIDX(synthLabels(3, 2))
	if err != nil {
		t.Fatal(err)
	}
	return l
}
