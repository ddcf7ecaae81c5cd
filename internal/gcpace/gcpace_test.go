package gcpace

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"testing"
	"time"
)

const mib = 1 << 20

func TestPercentIsTheHeadroomWithinBounds(t *testing.T) {
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{0, 32 * mib, 100},         // nothing live yet: the upper bound
		{16 * mib, 32 * mib, 100},  // 200% wanted, capped
		{64 * mib, 32 * mib, 50},   // the headroom is half the heap
		{100 * mib, 32 * mib, 32},  // (rounded down)
		{320 * mib, 32 * mib, 10},  // exactly the lower bound
		{4096 * mib, 32 * mib, 10}, // far below it: the lower bound
	} {
		if got := Percent(c.live, c.headroom, 10, 100); got != c.want {
			t.Errorf("Percent(%d MiB live, %d MiB) = %d, want %d", c.live/mib, c.headroom/mib, got, c.want)
		}
	}
}

// TestPacerSetsOnChangeAndRestores: GOGC follows the live heap as it
// grows (a table filling), is set only when the percentage changes, is
// left alone while the heap is not known, and the value found is put
// back at the end.
func TestPacerSetsOnChangeAndRestores(t *testing.T) {
	gogc := 10
	var sets []int
	lives := []uint64{0, 16 * mib, 32 * mib, 64 * mib, 64 * mib, 0, 400 * mib}
	known := []bool{true, true, true, true, true, false, true}
	i := 0
	p := &pacer{headroom: 32 * mib, lo: 10, hi: 100, now: -1,
		live: func() (uint64, bool) { return lives[i], known[i] },
		set: func(v int) int {
			was := gogc
			gogc = v
			sets = append(sets, v)
			return was
		}}
	for i = range lives {
		p.pace()
	}
	if want := []int{100, 50, 10}; !slices.Equal(sets, want) {
		t.Fatalf("GOGC set to %v as the heap went %v, want %v", sets, lives, want)
	}
	p.restore()
	if gogc != 10 {
		t.Fatalf("GOGC %d after restore, want the 10 found", gogc)
	}
}

// gogcNow reads GOGC without setting it.
func gogcNow(t *testing.T) int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Skip("this runtime does not report /gc/gogc:percent")
	}
	return int(s[0].Value.Uint64())
}

// TestKeepSetsGOGCAndPutsItBack: while Keep runs, GOGC is its Percent of
// this test's live heap (a headroom of one byte: the lower bound), and
// the GOGC it found is back once its context ends.
func TestKeepSetsGOGCAndPutsItBack(t *testing.T) {
	runtime.GC() // (a live heap measured)
	before := debug.SetGCPercent(77)
	defer debug.SetGCPercent(before)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Keep(ctx, time.Millisecond, 1, 23, 90)
		close(done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for gogcNow(t) != 23 {
		if time.Now().After(deadline) {
			t.Fatalf("GOGC %d after 10 s of Keep, want 23", gogcNow(t))
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if got := gogcNow(t); got != 77 {
		t.Fatalf("GOGC %d after Keep returned, want the 77 it found", got)
	}
}
