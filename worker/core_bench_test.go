package worker

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/pstrain/pstrain/config"
)

// BenchmarkCoreStep is the core's own cost of one sync step of two
// shards with the next pulls sent with the pushes: the events of a
// step and the actions they give, without I/O or passes.
func BenchmarkCoreStep(b *testing.B) {
	c := NewCore(CoreParams{Shards: 2, Mode: config.Sync, Overlap: true}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	now := time.Unix(0, 0)
	c.Start(now)
	for s := range 2 {
		c.Pulled(now, PullAnswer{Shard: s, Version: 0, Generation: 1})
	}
	b.ReportAllocs()
	for i := range b.N {
		v := int64(i + 1)
		c.Computed(now, 1, nil)
		for s := range 2 {
			c.Pulled(now, PullAnswer{Shard: s, Version: v, Generation: 1, Position: v})
		}
		c.Pushed(now, PushOutcome{Shard: 0})
		if acts := c.Pushed(now, PushOutcome{Shard: 1}); len(acts) == 0 {
			b.Fatal("the step did not go on")
		}
	}
}
