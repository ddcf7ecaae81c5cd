package bench

import (
	"context"
	"fmt"
	"time"
)

// Clock returns the current time; tests may pass a fake.
type Clock func() time.Time

// loop runs f until at least minIters calls have been made and budget has
// elapsed (or ctx ends, which is an error). It returns the number of calls
// and the time they took.
func loop(ctx context.Context, now Clock, budget time.Duration, minIters int, f func() error) (int, time.Duration, error) {
	start := now()
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return n, now().Sub(start), err
		}
		if err := f(); err != nil {
			return n, now().Sub(start), err
		}
		n++
		el := now().Sub(start)
		if n >= minIters && el >= budget {
			return n, el, nil
		}
	}
}

// rate is count per second over d; 0 when d is not positive.
func rate(count float64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return count / d.Seconds()
}

// ratio is a/b, or 0 when b is 0 (a missing ceiling is not a division by
// zero worth crashing a benchmark for; the table shows it as "-").
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// best keeps the largest value seen: on a shared machine the fastest of a
// few rounds is the one least disturbed by other processes.
type best float64

func (b *best) add(v float64) {
	if v > float64(*b) {
		*b = best(v)
	}
}

func checkDurations(budget time.Duration, rounds int) error {
	if budget <= 0 {
		return fmt.Errorf("bench: measurement time must be positive, got %v", budget)
	}
	if rounds < 1 {
		return fmt.Errorf("bench: rounds must be at least 1, got %d", rounds)
	}
	return nil
}
