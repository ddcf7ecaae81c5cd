// Package retry calls an operation until it succeeds, fails for good, or
// has failed in a retryable way for too long, pausing between attempts
// with a doubling backoff. Workers, the chief and every task's
// registration retry gRPC calls this way; each says which errors are
// worth retrying and words its own errors.
package retry

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Policy says which failures are retried, how long, and how often.
type Policy struct {
	// First and Max bound the pause between attempts: it starts at First
	// and doubles up to Max.
	First, Max time.Duration
	// Patience is how long retryable failures may go on, counted from the
	// first one.
	Patience time.Duration
	// Retryable reports whether an error is worth another attempt.
	Retryable func(error) bool
	// OnRetry, if set, is called before each pause with the attempt that
	// failed (from 1) and its error: to log the first, count them all.
	OnRetry func(attempt int, err error)
	// Now and After are the clock; nil means the real one.
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
}

// GaveUpError is what Do returns when retryable failures lasted longer
// than the policy's patience; Err is the last of them.
type GaveUpError struct {
	Err   error
	After time.Duration
}

func (e *GaveUpError) Error() string {
	return fmt.Sprintf("still failing after %v: %v", e.After, e.Err)
}

func (e *GaveUpError) Unwrap() error { return e.Err }

// Do calls f until it returns nil (Do returns nil), an error the policy
// does not retry (returned as it is), ctx ends (ctx.Err()), or retryable
// errors have gone on for the policy's patience (a *GaveUpError).
func Do(ctx context.Context, p Policy, f func(context.Context) error) error {
	now, after := p.Now, p.After
	if now == nil {
		now = time.Now
	}
	if after == nil {
		after = time.After
	}
	pause := p.First
	var first time.Time
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !p.Retryable(err) {
			return err
		}
		if first.IsZero() {
			first = now()
		} else if waited := now().Sub(first); waited > p.Patience {
			return &GaveUpError{Err: err, After: waited}
		}
		if p.OnRetry != nil {
			p.OnRetry(attempt, err)
		}
		select {
		case <-after(pause):
		case <-ctx.Done():
			return ctx.Err()
		}
		pause = min(2*pause, p.Max)
	}
}

// OnCodes is a Retryable that retries errors with one of these gRPC codes.
func OnCodes(cs ...codes.Code) func(error) bool {
	return func(err error) bool { return slices.Contains(cs, status.Code(err)) }
}
