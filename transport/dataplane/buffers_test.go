package dataplane

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// After a burst, kept buffers of the push size are reused newest first,
// dropped once unused for KeepBuffers, and never kept in another size.
func TestKeptBuffersComeBackDown(t *testing.T) {
	now := time.Unix(0, 0)
	var held atomic.Int64
	p := newBuffers(Limits{MaxBuffered: 1 << 20, MinBufferedPushes: 1, KeepBuffers: time.Minute}.WithDefaults(),
		func() time.Time { return now }, held.Store)
	p.setSize(1000)
	ctx := context.Background()
	var bs [][]byte
	for range 4 {
		b, err := p.get(ctx, 1000, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	odd, err := p.get(ctx, 600, time.Second) // not the push size: never kept
	if err != nil {
		t.Fatal(err)
	}
	if held.Load() != 4600 {
		t.Fatalf("held %d, want 4600", held.Load())
	}
	for i, b := range bs {
		now = now.Add(time.Duration(i) * time.Second)
		p.put(b)
	}
	p.put(odd)
	if used, kept, _ := p.stats(); used != 0 || kept != 4000 || held.Load() != 4000 {
		t.Fatalf("after the burst: used %d, kept %d, held %d; want 0, 4000, 4000", used, kept, held.Load())
	}
	// The next push reuses the newest.
	b, _ := p.get(ctx, 1000, time.Second)
	if &b[0] != &bs[3][0] {
		t.Fatal("the next push did not reuse the newest kept buffer")
	}
	p.put(b)
	// A minute later, all but the one just used are dropped.
	now = now.Add(time.Minute - time.Second)
	p.trim()
	if _, kept, _ := p.stats(); kept != 1000 {
		t.Fatalf("a minute after the burst: kept %d, want 1000 (the one used since)", kept)
	}
	now = now.Add(time.Minute)
	p.trim()
	if _, kept, _ := p.stats(); kept != 0 || held.Load() != 0 {
		t.Fatalf("two minutes after: kept %d, held %d; want nothing", kept, held.Load())
	}
}

// Kept buffers give way to a push that needs their room; a new push
// size drops the kept ones of the old size and raises the budget to
// MinBufferedPushes pushes.
func TestKeptBuffersGiveWay(t *testing.T) {
	now := time.Unix(0, 0)
	p := newBuffers(Limits{MaxBuffered: 3000, MinBufferedPushes: 4, KeepBuffers: time.Hour}.WithDefaults(),
		func() time.Time { return now }, nil)
	p.setSize(500) // 4 x 500 < 3000: the budget stays 3000
	ctx := context.Background()
	var bs [][]byte
	for range 6 {
		b, err := p.get(ctx, 500, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	for _, b := range bs {
		p.put(b)
	}
	if _, kept, limit := p.stats(); kept != 3000 || limit != 3000 {
		t.Fatalf("kept %d of %d, want the whole budget", kept, limit)
	}
	// A push of another size (below the push size) needs room: kept
	// buffers make it.
	b, err := p.get(ctx, 400, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if used, kept, _ := p.stats(); used != 400 || kept != 2500 {
		t.Fatalf("used %d kept %d, want 400 and 2500", used, kept)
	}
	p.put(b)
	p.setSize(1000) // 4 x 1000 > 3000: the budget grows; old-size buffers go
	if _, kept, limit := p.stats(); kept != 0 || limit != 4000 {
		t.Fatalf("after a new push size: kept %d, budget %d; want 0 and 4000", kept, limit)
	}
	if _, err := p.get(ctx, 1001, time.Second); !errors.Is(err, errTooLarge) {
		t.Fatalf("a push past the push size: %v", err)
	}
}

// Many goroutines getting and releasing buffers of random sizes: the
// bytes held never exceed the budget, and every get is served.
func TestBudgetHoldsUnderRandomLoad(t *testing.T) {
	const budget = 1 << 20
	var mu sync.Mutex
	var peak int64
	p := newBuffers(Limits{MaxBuffered: budget, MinBufferedPushes: 1, KeepBuffers: time.Hour}.WithDefaults(), time.Now,
		func(n int64) {
			mu.Lock()
			peak = max(peak, n)
			mu.Unlock()
		})
	p.setSize(200 << 10)
	var wg sync.WaitGroup
	var served atomic.Int64
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 200 {
				n := 200 << 10 // mostly the push size, kept and reused
				if r.IntN(3) == 0 {
					n = 1 + r.IntN(200<<10)
				}
				b, err := p.get(context.Background(), n, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				b[0], b[n-1] = 1, 1
				served.Add(1)
				p.put(b)
			}
		}()
	}
	wg.Wait()
	if served.Load() != 16*200 {
		t.Fatalf("%d gets served, want %d", served.Load(), 16*200)
	}
	if peak > budget {
		t.Fatalf("held %d bytes at once, over the budget of %d", peak, budget)
	}
	if used, _, _ := p.stats(); used != 0 {
		t.Fatalf("%d bytes still in use", used)
	}
}
