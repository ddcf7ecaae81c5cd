package parallel

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestForCallsEachOnceOnAtMostWorkers: every index once, never more
// calls at a time than workers, and all of them done when For returns.
func TestForCallsEachOnceOnAtMostWorkers(t *testing.T) {
	for _, c := range []struct{ n, workers int }{{0, 2}, {1, 4}, {7, 1}, {7, 3}, {5, 0}} {
		var mu sync.Mutex
		seen := map[int]int{}
		var now, most atomic.Int64
		For(c.n, c.workers, func(i int) {
			k := now.Add(1)
			for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
			}
			time.Sleep(time.Millisecond) // (lets the calls overlap)
			mu.Lock()
			seen[i]++
			mu.Unlock()
			now.Add(-1)
		})
		if len(seen) != c.n {
			t.Fatalf("n=%d workers=%d: %d indices called, want %d", c.n, c.workers, len(seen), c.n)
		}
		for i, k := range seen {
			if i < 0 || i >= c.n || k != 1 {
				t.Fatalf("n=%d workers=%d: index %d called %d times", c.n, c.workers, i, k)
			}
		}
		if limit := int64(max(1, c.workers)); most.Load() > limit {
			t.Fatalf("n=%d workers=%d: %d calls at once", c.n, c.workers, most.Load())
		}
	}
}
