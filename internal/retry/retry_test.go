package retry

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var (
	errBusy = errors.New("busy")
	errBad  = errors.New("bad")
)

// fakeClock moves time forward by each pause it is asked for, at once.
type fakeClock struct {
	t      time.Time
	pauses []time.Duration
}

func (c *fakeClock) now() time.Time { return c.t }

func (c *fakeClock) after(d time.Duration) <-chan time.Time {
	c.pauses = append(c.pauses, d)
	c.t = c.t.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.t
	return ch
}

// script returns an operation that fails with errs in turn, then succeeds,
// and the number of calls it has had.
func script(errs ...error) (func(context.Context) error, *int) {
	calls := 0
	return func(context.Context) error {
		calls++
		if calls <= len(errs) {
			return errs[calls-1]
		}
		return nil
	}, &calls
}

func policy(c *fakeClock, retried *[]int) Policy {
	return Policy{First: 10 * time.Millisecond, Max: 40 * time.Millisecond, Patience: 100 * time.Millisecond,
		Retryable: func(err error) bool { return errors.Is(err, errBusy) },
		OnRetry:   func(attempt int, _ error) { *retried = append(*retried, attempt) },
		Now:       c.now, After: c.after}
}

func TestRetriesUntilSuccessWithDoublingPauses(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0)}
	var retried []int
	f, calls := script(errBusy, errBusy, errBusy, errBusy)
	err := Do(context.Background(), policy(c, &retried), f)
	if err != nil || *calls != 5 {
		t.Fatalf("Do = %v after %d calls, want nil after 5", err, *calls)
	}
	ms := time.Millisecond
	if want := []time.Duration{10 * ms, 20 * ms, 40 * ms, 40 * ms}; !slices.Equal(c.pauses, want) {
		t.Fatalf("pauses %v, want %v", c.pauses, want)
	}
	if want := []int{1, 2, 3, 4}; !slices.Equal(retried, want) {
		t.Fatalf("OnRetry attempts %v, want %v", retried, want)
	}
}

func TestOtherErrorsAreReturnedAtOnce(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0)}
	var retried []int
	f, calls := script(errBusy, errBad)
	err := Do(context.Background(), policy(c, &retried), f)
	if err != errBad || *calls != 2 || len(retried) != 1 {
		t.Fatalf("Do = %v after %d calls and %d retries, want %v after 2 calls, 1 retry", err, *calls, len(retried), errBad)
	}
}

func TestGivesUpAfterPatienceFromTheFirstFailure(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0)}
	var retried []int
	calls := 0
	err := Do(context.Background(), policy(c, &retried), func(context.Context) error {
		calls++
		if calls == 1 {
			c.t = c.t.Add(time.Hour) // a slow first attempt does not use up the patience
		}
		return errBusy
	})
	var gaveUp *GaveUpError
	if !errors.As(err, &gaveUp) || !errors.Is(err, errBusy) {
		t.Fatalf("Do = %v, want a GaveUpError wrapping %v", err, errBusy)
	}
	// Failures at 0, 10, 30, 70 and 110 ms after the first: the fifth is
	// past the 100 ms of patience.
	if calls != 5 || gaveUp.After != 110*time.Millisecond {
		t.Fatalf("gave up after %d calls and %v, want 5 and 110ms", calls, gaveUp.After)
	}
}

func TestCancelledWhilePausing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := Policy{First: time.Hour, Max: time.Hour, Patience: time.Hour,
		Retryable: func(error) bool { return true },
		OnRetry:   func(int, error) { cancel() }}
	if err := Do(ctx, p, func(context.Context) error { return errBusy }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do = %v, want context.Canceled", err)
	}
}

func TestOnCodes(t *testing.T) {
	r := OnCodes(codes.Unavailable, codes.DeadlineExceeded)
	for _, c := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, "down"), true},
		{status.Error(codes.DeadlineExceeded, "slow"), true},
		{status.Error(codes.InvalidArgument, "no"), false},
		{errBusy, false}, // not a status: codes.Unknown
	} {
		if got := r(c.err); got != c.want {
			t.Errorf("OnCodes(...)(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
