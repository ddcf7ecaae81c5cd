package dataplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// errTooLarge: a push larger than the shard's push size, or than the
// whole budget, which no amount of waiting would make room for.
var errTooLarge = errors.New("dataplane: push too large")

// errBusy: the budget had no room for a push in time.
var errBusy = errors.New("dataplane: push buffers full")

// buffers hands out the buffers push payloads are read into, within a
// byte budget shared by every connection: whatever clients announce, the
// payload bytes a server holds at once stay within the budget. A push
// that would exceed it waits for room; one larger than the shard's push
// size (once known) or the whole budget is refused before any of its
// payload is read.
//
// Released buffers of the shard's push size are kept for the next pushes
// (the steady state allocates nothing, as the connection-owned buffers
// did before), newest first, and dropped once unused for keepFor, or as
// soon as the budget needs their room: memory comes back down after a
// burst instead of staying at the largest one ever seen.
//
// Invariant: used + freeBytes <= limit, except right after setSize
// lowered the limit, until enough buffers are released.
type buffers struct {
	base      int64 // Limits.MaxBuffered
	minPushes int   // Limits.MinBufferedPushes
	keepFor   time.Duration
	now       func() time.Time
	held      func(int64) // called with used + freeBytes after each change

	mu        sync.Mutex
	size      int   // the shard's push size; 0 until known
	limit     int64 // max(base, minPushes*size)
	used      int64 // bytes of buffers handed out
	free      []freeBuf
	freeBytes int64
	wake      chan struct{} // closed and replaced when room is made
}

type freeBuf struct {
	b     []byte
	since time.Time
}

func newBuffers(l Limits, now func() time.Time, held func(int64)) *buffers {
	if held == nil {
		held = func(int64) {}
	}
	return &buffers{base: l.MaxBuffered, minPushes: l.MinBufferedPushes, keepFor: l.KeepBuffers, now: now, held: held,
		limit: l.MaxBuffered, wake: make(chan struct{})}
}

// setSize records the shard's push size: larger pushes are refused, the
// budget holds at least minPushes of them, and only buffers of that size
// are kept for reuse.
func (p *buffers) setSize(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.size = n
	p.limit = max(p.base, int64(p.minPushes)*int64(n))
	kept := p.free[:0]
	for _, f := range p.free {
		if len(f.b) == n {
			kept = append(kept, f)
		} else {
			p.freeBytes -= int64(len(f.b))
		}
	}
	clear(p.free[len(kept):])
	p.free = kept
	p.changed()
}

// get returns a buffer of n bytes, waiting up to wait for room in the
// budget (then errBusy) unless ctx ends first (its error). A push it can
// never hold is errTooLarge at once.
func (p *buffers) get(ctx context.Context, n int, wait time.Duration) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	var timeout <-chan time.Time // made only if get has to wait
	for {
		p.mu.Lock()
		if err := p.refuse(n); err != nil {
			p.mu.Unlock()
			return nil, err
		}
		if n == p.size && len(p.free) > 0 {
			f := p.free[len(p.free)-1]
			p.free[len(p.free)-1] = freeBuf{}
			p.free = p.free[:len(p.free)-1]
			p.freeBytes -= int64(n)
			p.used += int64(n)
			p.changed()
			p.mu.Unlock()
			return f.b, nil
		}
		// Kept buffers give way to a push that needs their room, oldest
		// first.
		for p.used+p.freeBytes+int64(n) > p.limit && len(p.free) > 0 {
			p.dropOldest()
		}
		if p.used+int64(n) <= p.limit {
			p.used += int64(n)
			p.changed()
			p.mu.Unlock()
			return make([]byte, n), nil
		}
		wake := p.wake
		p.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-wake:
		case <-timeout:
			return nil, fmt.Errorf("%w: waited %v for %d bytes", errBusy, wait, n)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// refuse says why a push of n bytes can never be held. Call with mu.
func (p *buffers) refuse(n int) error {
	switch {
	case p.size > 0 && n > p.size:
		return fmt.Errorf("%w: %d bytes, the shard's gradient is %d", errTooLarge, n, p.size)
	case int64(n) > p.limit:
		return fmt.Errorf("%w: %d bytes, more than the %d bytes of push buffers (--max-buffered-mb)", errTooLarge, n, p.limit)
	}
	return nil
}

// put releases a buffer get returned (nil is a no-op).
func (p *buffers) put(b []byte) {
	if len(b) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used -= int64(len(b))
	if len(b) == p.size && p.used+p.freeBytes+int64(len(b)) <= p.limit {
		p.free = append(p.free, freeBuf{b: b, since: p.now()})
		p.freeBytes += int64(len(b))
	}
	p.trimLocked()
	close(p.wake)
	p.wake = make(chan struct{})
	p.changed()
}

// trim drops kept buffers unused for keepFor.
func (p *buffers) trim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trimLocked()
	p.changed()
}

func (p *buffers) trimLocked() {
	t := p.now()
	for len(p.free) > 0 && t.Sub(p.free[0].since) >= p.keepFor {
		p.dropOldest()
	}
}

// dropOldest lets the garbage collector have the oldest kept buffer.
// Call with mu and a non-empty free list.
func (p *buffers) dropOldest() {
	p.freeBytes -= int64(len(p.free[0].b))
	p.free[0] = freeBuf{}
	p.free = p.free[1:]
}

// changed reports the bytes held. Call with mu.
func (p *buffers) changed() { p.held(p.used + p.freeBytes) }

// stats returns the bytes handed out, the bytes kept, and the budget.
func (p *buffers) stats() (used, kept, limit int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used, p.freeBytes, p.limit
}
