package dataset

import (
	"slices"
	"testing"
)

// fullLabels takes the next batch of f and returns its labels (which
// identify samples in these tests) after checking the images match them.
func fullLabels(t *testing.T, f *FullBatches, ds *Dataset, B int) []uint8 {
	t.Helper()
	x, y := make([]float32, B*ds.Dim), make([]uint8, B)
	f.Next(x, y)
	for i, l := range y {
		if !slices.Equal(x[i*ds.Dim:(i+1)*ds.Dim], ds.Image(int(l))) {
			t.Fatalf("item %d: image is not sample %d's", i, l)
		}
	}
	return y
}

// Position p is batch p mod F of epoch p / F, which is the Batcher's step
// e*K + k: the short last batch of every epoch is skipped, across epoch
// boundaries, and each epoch uses every sample at most once.
func TestFullBatchesSkipTheShortBatch(t *testing.T) {
	ds := mustDataset(t, 23, 2, 2, 256) // labels identify samples
	const B, seed = 5, 100
	f := NewFullBatches(NewBatcher(ds, B, seed))
	if f.PerEpoch() != 4 {
		t.Fatalf("PerEpoch = %d, want 4", f.PerEpoch())
	}
	var epoch []uint8
	for p := int64(0); p < 14; p++ {
		if f.Position() != p || f.Epoch() != p/4 {
			t.Fatalf("Position %d Epoch %d, want %d %d", f.Position(), f.Epoch(), p, p/4)
		}
		got := fullLabels(t, f, ds, B)
		e, k := int(p/4), int(p%4)
		perm := Permutation(ds.N, seed+int64(e))
		for i, j := range perm[k*B : (k+1)*B] {
			if got[i] != ds.Labels[j] {
				t.Fatalf("position %d (epoch %d batch %d): item %d is sample %d, want %d", p, e, k, i, got[i], j)
			}
		}
		epoch = append(epoch, got...)
		if k == 3 {
			// The epoch's 20 samples: distinct, and the 3 left out are
			// the ones its permutation puts last.
			slices.Sort(epoch)
			if len(slices.Compact(slices.Clone(epoch))) != 20 {
				t.Fatalf("epoch %d repeats samples: %v", e, epoch)
			}
			for _, j := range perm[20:] {
				if slices.Contains(epoch, uint8(j)) {
					t.Fatalf("epoch %d used sample %d of its short batch", e, j)
				}
			}
			epoch = epoch[:0]
		}
	}
}

// Seeking anywhere (forwards, backwards, across epochs, far ahead)
// continues the same sequence as taking that many batches.
func TestFullBatchesSeek(t *testing.T) {
	ds := mustDataset(t, 37, 3, 3, 256)
	const B = 8 // 4 full batches of 8, and 5 samples left over
	ref := NewFullBatches(NewBatcher(ds, B, 7))
	var want [][]uint8
	for range 30 {
		want = append(want, fullLabels(t, ref, ds, B))
	}
	for _, p := range []int64{0, 3, 4, 5, 13, 29, 4, 0} {
		f := NewFullBatches(NewBatcher(ds, B, 7))
		fullLabels(t, f, ds, B) // move first
		f.SeekBatch(p)
		for q := p; q < 30; q++ {
			if got := fullLabels(t, f, ds, B); !slices.Equal(got, want[q]) {
				t.Fatalf("after SeekBatch(%d), position %d is %v, want %v", p, q, got, want[q])
			}
		}
	}
	// Far ahead: the same as the Batcher's step.
	f := NewFullBatches(NewBatcher(ds, B, 7))
	f.SeekBatch(1001) // epoch 250, batch 1
	b := NewBatcher(ds, B, 7)
	b.SeekStep(250*5 + 1)
	x, y := make([]float32, B*ds.Dim), make([]uint8, B)
	b.Next(x, y)
	if got := fullLabels(t, f, ds, B); !slices.Equal(got, y) {
		t.Fatalf("position 1001 is %v, the Batcher's step 1251 %v", got, y)
	}
	mustPanic(t, "SeekBatch(-1)", func() { f.SeekBatch(-1) })
	mustPanic(t, "short buffers", func() { f.Next(x[:1], y) })
}

// When B divides N every epoch is every sample exactly once.
func TestFullBatchesWholeEpochs(t *testing.T) {
	ds := mustDataset(t, 24, 1, 2, 256)
	f := NewFullBatches(NewBatcher(ds, 4, 3))
	for e := range 3 {
		var all []uint8
		for range f.PerEpoch() {
			all = append(all, fullLabels(t, f, ds, 4)...)
		}
		slices.Sort(all)
		for i, l := range all {
			if int(l) != i {
				t.Fatalf("epoch %d is not every sample once: %v", e, all)
			}
		}
	}
}

// A shard smaller than a batch: one batch per epoch, the epoch's
// permutation repeated to fill it. An empty shard leaves the buffers.
func TestFullBatchesTinyShard(t *testing.T) {
	ds := mustDataset(t, 3, 1, 2, 256)
	f := NewFullBatches(NewBatcher(ds, 7, 5))
	if f.PerEpoch() != 1 {
		t.Fatalf("PerEpoch = %d, want 1", f.PerEpoch())
	}
	for e := range 4 {
		got := fullLabels(t, f, ds, 7)
		perm := Permutation(3, 5+int64(e))
		for i, l := range got {
			if int(l) != perm[i%3] {
				t.Fatalf("epoch %d: %v, want permutation %v repeated", e, got, perm)
			}
		}
	}
	empty := mustDataset(t, 0, 1, 2, 256)
	fe := NewFullBatches(NewBatcher(empty, 4, 0))
	x, y := []float32{1, 2, 3, 4, 5, 6, 7, 8}, []uint8{9, 9, 9, 9}
	fe.Next(x, y)
	if fe.Position() != 1 || y[0] != 9 || x[0] != 1 {
		t.Fatalf("empty shard: position %d, buffers %v %v", fe.Position(), x, y)
	}
}
