// Package gcpace keeps a process's garbage collector to a headroom of
// bytes rather than a fraction of its live heap.
//
// GOGC is a fraction: the next collection starts once the heap has grown
// by GOGC percent of what the last one found live. A process whose live
// heap is large and whose garbage is small wants a small fraction (its
// memory stays near its live size at little cost), one whose live heap is
// small and whose garbage comes fast wants a large one (at 10% of a 50 MB
// heap it collects every 5 MB of garbage, several times a second). A
// parameter server holding embedding tables is both in turn: its tables
// start empty and grow, or are loaded, to hundreds of megabytes, while
// its row requests make garbage at a rate that does not grow with them.
// Keep gives such a process a fixed headroom instead: GOGC is set, as
// the live heap changes, to the percentage of it that the headroom is,
// within bounds.
package gcpace

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Percent is the GOGC that lets a heap of live bytes grow by headroom
// bytes before the next collection, within [lo, hi] (an empty heap: hi).
func Percent(live, headroom uint64, lo, hi int) int {
	if live == 0 {
		return hi
	}
	p := headroom * 100 / live
	switch {
	case p < uint64(lo):
		return lo
	case p > uint64(hi):
		return hi
	}
	return int(p)
}

// pacer sets GOGC from the live heap: live reads it (false: not
// known), set sets GOGC and returns the value before.
type pacer struct {
	headroom uint64
	lo, hi   int
	live     func() (uint64, bool)
	set      func(int) int

	now     int // the GOGC set, -1: none yet
	found   int // the GOGC before the first set
	changed bool
}

// pace sets GOGC to Percent of the live heap if that is not what it is.
func (p *pacer) pace() {
	live, ok := p.live()
	if !ok {
		return
	}
	if v := Percent(live, p.headroom, p.lo, p.hi); v != p.now {
		if was := p.set(v); !p.changed {
			p.found, p.changed = was, true
		}
		p.now = v
	}
}

// restore puts back the GOGC found before the first set, if any.
func (p *pacer) restore() {
	if p.changed {
		p.set(p.found)
		p.changed, p.now = false, -1
	}
}

// liveMetric is the runtime's count of the heap the last collection
// found live.
const liveMetric = "/gc/heap/live:bytes"

// Keep sets GOGC to Percent of the live heap now, then again every
// interval until ctx ends, and puts back the GOGC it found when it
// returns. The value is set only when it changes.
func Keep(ctx context.Context, interval time.Duration, headroom uint64, lo, hi int) {
	sample := []metrics.Sample{{Name: liveMetric}}
	p := &pacer{headroom: headroom, lo: lo, hi: hi, now: -1, set: debug.SetGCPercent,
		live: func() (uint64, bool) {
			metrics.Read(sample)
			if sample[0].Value.Kind() != metrics.KindUint64 {
				return 0, false // (a runtime without the metric: GOGC stays)
			}
			return sample[0].Value.Uint64(), true
		}}
	defer p.restore()
	p.pace()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.pace()
		}
	}
}
