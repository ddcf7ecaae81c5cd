package dataset

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// syntheticLabels are n labels of classes classes with unequal shares
// (class c about c+1 parts), in a seeded order.
func syntheticLabels(n, classes int, seed uint64) []uint8 {
	rng := rand.New(rand.NewPCG(seed, 1))
	parts := classes * (classes + 1) / 2
	out := make([]uint8, n)
	for i := range out {
		p := rng.IntN(parts)
		c := 0
		for p >= c+1 {
			p -= c + 1
			c++
		}
		out[i] = uint8(c)
	}
	return out
}

func TestSampleDeterministicPerSeed(t *testing.T) {
	labels := syntheticLabels(5000, 10, 7)
	a := NewSample(labels, 10, 1).Take(0.2)
	b := NewSample(labels, 10, 1).Take(0.2)
	c := NewSample(labels, 10, 2).Take(0.2)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed drew different samples")
	}
	if slices.Equal(a, c) {
		t.Fatal("seeds 1 and 2 drew the same sample")
	}
	if !slices.IsSorted(a) {
		t.Error("a sample's indices are not in ascending order")
	}
	// A smaller fraction's sample is part of a larger one's.
	small := NewSample(labels, 10, 1).Take(0.05)
	for _, i := range small {
		if _, ok := slices.BinarySearch(a, i); !ok {
			t.Fatalf("index %d of the 0.05 sample is not in the 0.2 sample", i)
		}
	}
	if all := NewSample(labels, 10, 1).Take(1); len(all) != len(labels) || all[0] != 0 || all[len(all)-1] != len(labels)-1 {
		t.Errorf("Take(1) has %d indices, want all %d", len(all), len(labels))
	}
	// Rest is the rest of the set: with Take, every index once.
	rest := NewSample(labels, 10, 1).Rest(0.2)
	both := slices.Sorted(slices.Values(append(slices.Clone(a), rest...)))
	if !slices.IsSorted(rest) || len(both) != len(labels) || both[0] != 0 || len(slices.Compact(both)) != len(labels) {
		t.Errorf("Take(0.2) (%d) and Rest(0.2) (%d) are not the set's %d indices once each", len(a), len(rest), len(labels))
	}
}

// Each class is in the sample in proportion to its share of the set, to
// the nearest sample.
func TestSampleClassBalance(t *testing.T) {
	const classes = 10
	labels := syntheticLabels(10000, classes, 3)
	count := make([]int, classes)
	for _, l := range labels {
		count[l]++
	}
	for _, f := range []float64{0.05, 0.2, 0.5} {
		got := make([]int, classes)
		idx := NewSample(labels, classes, 9).Take(f)
		for _, i := range idx {
			got[labels[i]]++
		}
		for c := range classes {
			if want := f * float64(count[c]); math.Abs(float64(got[c])-want) > 0.5 {
				t.Errorf("fraction %v class %d: %d samples, want %.1f", f, c, got[c], want)
			}
		}
		if len(idx) != len(slices.Compact(slices.Clone(idx))) {
			t.Errorf("fraction %v: an index drawn twice", f)
		}
	}
}

// On a set whose hard samples are bunched by position and by class (the
// case where a fixed stride or a class imbalance would read high or
// low), the sample's accuracy averaged over seeds is the whole set's.
func TestSampleUnbiased(t *testing.T) {
	const n, classes, seeds = 4000, 10, 400
	labels := syntheticLabels(n, classes, 5)
	rng := rand.New(rand.NewPCG(11, 2))
	correct := make([]bool, n)
	whole := 0.0
	for i := range correct {
		p := 0.99 - 0.08*float64(labels[i])/classes // harder classes
		if i%5 != 0 {
			p -= 0.05 // every fifth sample easier
		}
		correct[i] = rng.Float64() < p
		if correct[i] {
			whole++
		}
	}
	whole /= n
	var sum, sumSq float64
	for s := range seeds {
		idx := NewSample(labels, classes, int64(s)).Take(0.2)
		acc := 0.0
		for _, i := range idx {
			if correct[i] {
				acc++
			}
		}
		d := acc/float64(len(idx)) - whole
		sum += d
		sumSq += d * d
	}
	mean := sum / seeds
	sd := math.Sqrt(sumSq/seeds - mean*mean)
	if se := sd / math.Sqrt(seeds); math.Abs(mean) > 4*se {
		t.Errorf("sample minus whole set: mean %.5f over %d seeds, %.1f standard errors from 0", mean, seeds, math.Abs(mean)/se)
	}
	// The fixed stride this replaces reads the easy fifth only.
	stride := 0.0
	for i := 0; i < n; i += 5 {
		if correct[i] {
			stride++
		}
	}
	if d := stride/float64(n/5) - whole; d < 0.02 {
		t.Errorf("the synthetic case does not separate: every fifth reads only %.4f above the whole set", d)
	}
}

// Successive windows of a fifth are different images: five of them are
// the set's classes once each, the sixth is the first again; each window
// with its RestAt is the whole set, and window 0 is Take's.
func TestSampleWindowsRotate(t *testing.T) {
	labels := syntheticLabels(5000, 10, 7)
	s := NewSample(labels, 10, 1)
	if !slices.Equal(s.TakeAt(0.2, 0), s.Take(0.2)) || !slices.Equal(s.RestAt(0.2, 0), s.Rest(0.2)) {
		t.Fatal("window 0 is not Take's sample")
	}
	seen := make([]int, len(labels))
	for k := range 5 {
		w, rest := s.TakeAt(0.2, k), s.RestAt(0.2, k)
		if !slices.IsSorted(w) || !slices.IsSorted(rest) || len(w)+len(rest) != len(labels) {
			t.Fatalf("window %d: %d + %d indices, want %d, each sorted", k, len(w), len(rest), len(labels))
		}
		if d := math.Abs(float64(len(w)) - 0.2*float64(len(labels))); d > 10 {
			t.Errorf("window %d holds %d indices, want about %v", k, len(w), 0.2*float64(len(labels)))
		}
		for _, i := range w {
			seen[i]++
		}
		for _, i := range rest {
			if _, ok := slices.BinarySearch(w, i); ok {
				t.Fatalf("window %d: index %d in both the window and its rest", k, i)
			}
		}
	}
	missed, twice := 0, 0
	for _, n := range seen {
		missed += max(1-n, 0)
		twice += max(n-1, 0)
	}
	// round(0.2 x count) per class: five windows fall short of a class,
	// or reach round into it again, by at most 2 indices.
	if missed > 10*2 || twice > 10*2 {
		t.Errorf("five windows of a fifth: %d indices never drawn, %d drawn twice; want at most 2 a class", missed, twice)
	}
	if slices.Equal(s.TakeAt(0.2, 1), s.TakeAt(0.2, 0)) {
		t.Error("windows 0 and 1 are the same sample")
	}
}
