package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// records is a slog handler keeping every record.
type records struct {
	mu  sync.Mutex
	got []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, rec)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// lines returns the records so far as (message, kind, count).
func (r *records) lines() []line {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []line
	for _, rec := range r.got {
		l := line{msg: rec.Message}
		rec.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "kind":
				l.kind = a.Value.String()
			case "count":
				l.count = int(a.Value.Int64())
			}
			return true
		})
		out = append(out, l)
	}
	return out
}

type line struct {
	msg, kind string
	count     int
}

// clock is a manual clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestAFloodIsOneLinePerIntervalWithItsCount(t *testing.T) {
	rec := &records{}
	clk := &clock{t: time.Unix(1000, 0)}
	l := New(slog.New(rec), 5*time.Second, clk.now)
	// 205 refusals within one second: one line, for the first.
	for range 205 {
		l.Warn("tls", "TLS handshake refused", "remote", "10.0.0.1:1")
		clk.advance(time.Second / 205)
	}
	got := rec.lines()
	if len(got) != 1 || got[0] != (line{"TLS handshake refused", "tls", 1}) {
		t.Fatalf("after a flood of 205: %+v, want one line with count 1", got)
	}
	// Another kind has its own interval.
	l.Warn("limit", "connection refused")
	if got := rec.lines(); len(got) != 2 || got[1] != (line{"connection refused", "limit", 1}) {
		t.Fatalf("another kind: %+v", got)
	}
	// Before the interval has passed, Flush says nothing.
	l.Flush(false)
	if got := rec.lines(); len(got) != 2 {
		t.Fatalf("flush within the interval logged: %+v", got)
	}
	// Once it has, the 204 suppressed ones are one line.
	clk.advance(5 * time.Second)
	l.Flush(false)
	got = rec.lines()
	if len(got) != 3 || got[2] != (line{"TLS handshake refused", "tls", 204}) {
		t.Fatalf("flush after the interval: %+v, want a line with count 204", got)
	}
	// Nothing left to say.
	clk.advance(time.Minute)
	l.Flush(true)
	if got := rec.lines(); len(got) != 3 {
		t.Fatalf("a second flush logged again: %+v", got)
	}
	// The next event after a quiet interval is logged at once, counting
	// only itself.
	l.Warn("tls", "TLS handshake refused")
	if got := rec.lines(); len(got) != 4 || got[3].count != 1 {
		t.Fatalf("after a quiet minute: %+v", got)
	}
	// Events within the interval, then one after it: that line carries
	// the count of all of them.
	for range 9 {
		l.Warn("tls", "TLS handshake refused")
	}
	clk.advance(6 * time.Second)
	l.Warn("tls", "TLS handshake refused")
	if got := rec.lines(); len(got) != 5 || got[4].count != 10 {
		t.Fatalf("a line after the interval: %+v, want count 10", got)
	}
	// A forced flush (the owner stopping) logs what is pending at once.
	l.Warn("tls", "TLS handshake refused")
	l.Flush(true)
	if got := rec.lines(); len(got) != 6 || got[5].count != 1 {
		t.Fatalf("forced flush: %+v", got)
	}
}
