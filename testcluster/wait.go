package testcluster

import (
	"context"
	"fmt"
	"time"
)

// pollEvery is how often WaitFor checks its condition.
const pollEvery = 2 * time.Millisecond

// WaitFor checks cond until it holds (nil) or ctx ends (an error naming
// what was awaited). Tests wait this way, never by sleeping.
func WaitFor(ctx context.Context, what string, cond func() bool) error {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testcluster: waiting for %s: %w", what, ctx.Err())
		case <-t.C:
		}
	}
}
