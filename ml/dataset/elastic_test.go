package dataset

import (
	"errors"
	"testing"
)

// idSet is n samples of dimension 1 whose value is the sample's index.
func idSet(n int) *Dataset {
	ds := &Dataset{Images: make([]float32, n), Labels: make([]uint8, n), N: n, Dim: 1, Classes: 1}
	for i := range ds.Images {
		ds.Images[i] = float32(i)
	}
	return ds
}

// TestElasticBatchesExactlyOncePerEpoch trains a lockstep sync run
// (every member reads one batch per step) through 2 -> 3 -> 1 -> 4
// workers, each change at an epoch boundary chosen by Boundary, and
// checks every epoch reads no sample twice and W*PerEpoch*B samples, and
// that each continuing worker's position at a boundary is its Start.
func TestElasticBatchesExactlyOncePerEpoch(t *testing.T) {
	const n, batch = 103, 4
	ds := idSet(n)
	load := func(i, c int) (Samples, error) { return ds.Shard(i, c), nil }
	plan := NewDataPlan(n, batch, 2)
	changes := map[int64]int{7: 3, 40: 1, 60: 4} // step a scale is asked at -> workers
	pending := map[int64]int{}                   // boundary step -> workers
	const maxW = 4
	srcs := make([]*ElasticBatches, maxW)
	pos := make([]int64, maxW)
	seen := map[int64]map[int]bool{} // epoch -> samples read
	perEpoch := map[int64]int{}      // epoch -> samples read
	x, y := make([]float32, batch), make([]uint8, batch)
	for step := int64(0); step < 120; step++ {
		if w, ok := changes[step]; ok {
			at, epoch := plan.Boundary(step + 1)
			pending[at] = w
			_ = epoch
		}
		if w, ok := pending[step]; ok {
			at, epoch := plan.Boundary(step)
			if at != step {
				t.Fatalf("boundary moved: %d, at step %d", at, step)
			}
			plan = plan.Scale(at, epoch, w)
			for i := range w {
				if want := plan.Start(i, len(plan.Eras)-1); pos[i] != want {
					t.Fatalf("step %d: worker %d at position %d, era starts at %d", step, i, pos[i], want)
				}
			}
		}
		for i := range plan.Last().Workers {
			if srcs[i] == nil {
				var err error
				if srcs[i], err = NewElasticBatches(i, 5, plan, load); err != nil {
					t.Fatal(err)
				}
			} else if err := srcs[i].SetPlan(plan); err != nil {
				t.Fatal(err)
			}
			_, epoch, _, err := srcs[i].Where(pos[i])
			if err != nil {
				t.Fatal(err)
			}
			srcs[i].SeekBatch(pos[i])
			srcs[i].Next(x, y)
			pos[i]++
			if seen[epoch] == nil {
				seen[epoch] = map[int]bool{}
			}
			for _, v := range x {
				if seen[epoch][int(v)] {
					t.Fatalf("epoch %d: sample %d read twice (worker %d, step %d)", epoch, int(v), i, step)
				}
				seen[epoch][int(v)] = true
				perEpoch[epoch]++
			}
		}
	}
	if len(plan.Eras) != 4 {
		t.Fatalf("eras %+v, want 4", plan.Eras)
	}
	// Every completed epoch read each member's PerEpoch batches.
	for k, e := range plan.Eras[:3] {
		want := e.Workers * int(plan.PerEpoch(k)) * batch
		for ep := e.Epoch; ep < plan.Eras[k+1].Epoch; ep++ {
			if perEpoch[ep] != want {
				t.Errorf("epoch %d (era %d, %d workers): %d samples read, want %d", ep, k, e.Workers, perEpoch[ep], want)
			}
		}
	}
}

func TestDataPlanLocate(t *testing.T) {
	// 100 samples, batch 10: 2 workers read 5 batches an epoch, 4 read 2.
	p := NewDataPlan(100, 10, 2).Scale(10, 2, 4).Scale(14, 4, 1)
	cases := []struct {
		w            int
		pos          int64
		era          int
		epoch, batch int64
		ok           bool
	}{
		{0, 0, 0, 0, 0, true},
		{1, 7, 0, 1, 2, true},
		{1, 10, 1, 2, 0, true}, // era 1 starts after 2 epochs of 5
		{3, 0, 1, 2, 0, true},  // a new worker starts at era 1
		{3, 3, 1, 3, 1, true},
		{3, 4, 0, 0, 0, false}, // removed at era 2
		{0, 14, 2, 4, 0, true}, // 10 + 2 epochs of 2
		{0, 25, 2, 5, 1, true}, // era 2: 10 batches an epoch
	}
	for _, c := range cases {
		k, e, b, ok := p.Locate(c.w, c.pos)
		if ok != c.ok || (ok && (k != c.era || e != c.epoch || b != c.batch)) {
			t.Errorf("Locate(%d, %d) = era %d epoch %d batch %d %t, want %d %d %d %t", c.w, c.pos, k, e, b, ok, c.era, c.epoch, c.batch, c.ok)
		}
	}
	if at, ep := p.Boundary(15); at != 24 || ep != 5 {
		t.Errorf("Boundary(15) = %d, %d; want 24, 5", at, ep)
	}
	if err := (DataPlan{N: 10, Batch: 1, Eras: []Era{{Workers: 2}, {Epoch: 0, Workers: 1}}}).Validate(); err == nil {
		t.Error("a plan whose eras do not advance validated")
	}
	b, err := NewElasticBatches(3, 0, p, func(i, c int) (Samples, error) { return idSet(100).Shard(i, c), nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.Where(4); !errors.Is(err, ErrNoEra) {
		t.Errorf("Where past the last era: %v, want ErrNoEra", err)
	}
}
