package dataset

import (
	"slices"
	"testing"
)

type batchRec struct {
	n, epoch int
	x        []float32
	y        []uint8
}

func takeBatches(b *Batcher, steps int) []batchRec {
	_, dim := b.ds.Shape()
	x := make([]float32, b.BatchSize()*dim)
	y := make([]uint8, b.BatchSize())
	var out []batchRec
	for i := 0; i < steps; i++ {
		n, e := b.Next(x, y)
		out = append(out, batchRec{n, e, slices.Clone(x[:n*dim]), slices.Clone(y[:n])})
	}
	return out
}

// The order is exactly the documented one: batch k of epoch e holds
// Permutation(N, seed+e)[k*B : min((k+1)*B, N)].
func TestBatcherDocumentedOrder(t *testing.T) {
	ds := mustDataset(t, 23, 2, 2, 256) // labels 0..22 identify samples
	const B, seed = 5, 100
	b := NewBatcher(ds, B, seed)
	if b.StepsPerEpoch() != 5 {
		t.Fatalf("StepsPerEpoch = %d", b.StepsPerEpoch())
	}
	got := takeBatches(b, 17)
	for s, rec := range got {
		e, k := s/5, s%5
		perm := Permutation(ds.N, seed+int64(e))
		want := perm[k*B : min((k+1)*B, ds.N)]
		if rec.epoch != e || rec.n != len(want) {
			t.Fatalf("step %d: n=%d epoch=%d, want %d, %d", s, rec.n, rec.epoch, len(want), e)
		}
		for i, j := range want {
			if rec.y[i] != ds.Labels[j] || !slices.Equal(rec.x[i*ds.Dim:(i+1)*ds.Dim], ds.Image(j)) {
				t.Fatalf("step %d item %d is not sample %d", s, i, j)
			}
		}
	}
	if b.Step() != 17 || b.Epoch() != 3 {
		t.Errorf("Step=%d Epoch=%d", b.Step(), b.Epoch())
	}
	// Each epoch visits every sample once; epochs differ in order.
	var e0, e1 []uint8
	for _, r := range got[:5] {
		e0 = append(e0, r.y...)
	}
	for _, r := range got[5:10] {
		e1 = append(e1, r.y...)
	}
	if slices.Equal(e0, e1) {
		t.Errorf("epochs 0 and 1 have the same order")
	}
	slices.Sort(e0)
	for i, v := range e0 {
		if int(v) != i {
			t.Fatalf("epoch 0 does not cover every sample once: %v", e0)
		}
	}
}

func TestBatcherReproducibleAndSeek(t *testing.T) {
	ds := mustDataset(t, 37, 3, 3, 10)
	a := takeBatches(NewBatcher(ds, 8, 7), 30)
	// An equal but separately built data set gives the same sequence.
	b := takeBatches(NewBatcher(mustDataset(t, 37, 3, 3, 10), 8, 7), 30)
	for i := range a {
		if a[i].n != b[i].n || a[i].epoch != b[i].epoch || !slices.Equal(a[i].x, b[i].x) || !slices.Equal(a[i].y, b[i].y) {
			t.Fatalf("step %d differs between two Batchers", i)
		}
	}
	if c := takeBatches(NewBatcher(ds, 8, 8), 1); slices.Equal(c[0].y, a[0].y) {
		t.Errorf("different seeds, same first batch")
	}
	// Seeking anywhere (forwards, backwards, across epochs) continues the
	// same sequence.
	for _, s := range []int64{0, 3, 4, 5, 13, 29, 4, 0} {
		bt := NewBatcher(ds, 8, 7)
		takeBatches(bt, 2) // move, so Seek must reset state
		bt.SeekStep(s)
		rest := takeBatches(bt, 30-int(s))
		for i, r := range rest {
			w := a[int(s)+i]
			if r.n != w.n || r.epoch != w.epoch || !slices.Equal(r.y, w.y) || !slices.Equal(r.x, w.x) {
				t.Fatalf("after SeekStep(%d), step %d differs", s, int(s)+i)
			}
		}
	}
	mustPanic(t, "SeekStep(-1)", func() { NewBatcher(ds, 8, 7).SeekStep(-1) })
}

func TestBatcherNoAllocs(t *testing.T) {
	ds := mustDataset(t, 50, 4, 4, 10)
	b := NewBatcher(ds, 7, 1)
	x := make([]float32, 7*ds.Dim)
	y := make([]uint8, 7)
	// Runs across several epoch boundaries.
	if allocs := testing.AllocsPerRun(100, func() { b.Next(x, y) }); allocs != 0 {
		t.Errorf("Next allocates %v times per call", allocs)
	}
}

func TestBatcherEdgeCases(t *testing.T) {
	// Batch larger than the data set: one short batch per epoch, buffers
	// need only hold N samples.
	ds := mustDataset(t, 3, 1, 2, 10)
	b := NewBatcher(ds, 10, 0)
	x, y := make([]float32, 6), make([]uint8, 3)
	for e := 0; e < 3; e++ {
		if n, ep := b.Next(x, y); n != 3 || ep != e {
			t.Errorf("n=%d epoch=%d", n, ep)
		}
	}
	// Too-small buffers panic.
	mustPanic(t, "short x", func() { b.Next(x[:5], y) })
	mustPanic(t, "short y", func() { b.Next(x, y[:2]) })
	mustPanic(t, "batch 0", func() { NewBatcher(ds, 0, 0) })
	// Untouched tail.
	ds2 := mustDataset(t, 5, 1, 1, 10)
	b2 := NewBatcher(ds2, 3, 0)
	x2, y2 := make([]float32, 3), []uint8{9, 9, 9}
	b2.Next(x2, y2)
	y2[2] = 99
	if n, _ := b2.Next(x2, y2); n != 2 || y2[2] != 99 {
		t.Errorf("short batch: n=%d tail=%d", n, y2[2])
	}
	// An empty data set yields empty batches, one step per epoch.
	empty := mustDataset(t, 0, 2, 2, 10)
	be := NewBatcher(empty, 4, 0)
	for e := 0; e < 2; e++ {
		if n, ep := be.Next(nil, nil); n != 0 || ep != e {
			t.Errorf("empty: n=%d epoch=%d", n, ep)
		}
	}
}

// Shard, Subset and Batcher compose: a worker's data order depends only on
// its shard and the seed.
func TestShardBatcherCompose(t *testing.T) {
	ds := mustDataset(t, 40, 2, 2, 40)
	for w := 0; w < 3; w++ {
		s1 := takeBatches(NewBatcher(ds.Subset(0.5, 3).Shard(w, 3), 4, int64(w)), 6)
		s2 := takeBatches(NewBatcher(ds.Subset(0.5, 3).Shard(w, 3), 4, int64(w)), 6)
		for i := range s1 {
			if !slices.Equal(s1[i].y, s2[i].y) {
				t.Fatalf("worker %d step %d differs", w, i)
			}
		}
	}
}
