// Package ratelog logs events that can come in floods — refused
// connections, cut connections, bad frames — at most once per interval
// for each kind, with how many there were. 205 hostile connections are
// one WARN line and a count, not 205 lines.
//
// The first event of a kind is logged at once. Those that follow within
// the interval are only counted; the next line of that kind (the first
// event after the interval, or Flush once the interval has passed) says
// how many there were since the previous line. The owner calls Flush
// periodically (a ticker) and once when it stops, so that a count is
// never lost when the flood ends.
package ratelog

import (
	"log/slog"
	"sync"
	"time"
)

// Logger rate-limits Warn lines per kind. The zero value is not usable:
// create it with New.
type Logger struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	kinds map[string]*kind
}

// kind is the state of one kind of event.
type kind struct {
	last time.Time // when the previous line was logged
	msg  string    // that line's message, repeated by Flush
	// unlogged counts events since the previous line.
	unlogged int
}

// New returns a logger writing to log (nil: events are dropped) at most
// once per every for each kind. now may be nil (time.Now).
func New(log *slog.Logger, every time.Duration, now func() time.Time) *Logger {
	if now == nil {
		now = time.Now
	}
	return &Logger{log: log, every: every, now: now, kinds: map[string]*kind{}}
}

// Warn records one event of the given kind and logs msg with attrs,
// plus "kind" and "count" (the events of this kind since the previous
// line, this one included), unless a line of this kind was logged less
// than the interval ago.
func (l *Logger) Warn(kindName, msg string, attrs ...any) {
	if l.log == nil {
		return
	}
	l.mu.Lock()
	k := l.kinds[kindName]
	if k == nil {
		k = &kind{}
		l.kinds[kindName] = k
	}
	k.unlogged++
	t := l.now()
	if !k.last.IsZero() && t.Sub(k.last) < l.every {
		l.mu.Unlock()
		return
	}
	n := k.unlogged
	k.last, k.msg, k.unlogged = t, msg, 0
	l.mu.Unlock()
	l.log.Warn(msg, append(attrs, "kind", kindName, "count", n)...)
}

// Flush logs, for every kind with events counted but not logged and
// whose previous line is at least an interval old, one line with the
// count. force logs them whatever their age (when the owner stops).
func (l *Logger) Flush(force bool) {
	if l.log == nil {
		return
	}
	type line struct {
		kind, msg string
		n         int
	}
	var lines []line
	l.mu.Lock()
	t := l.now()
	for name, k := range l.kinds {
		if k.unlogged == 0 || (!force && t.Sub(k.last) < l.every) {
			continue
		}
		lines = append(lines, line{name, k.msg, k.unlogged})
		k.last, k.unlogged = t, 0
	}
	l.mu.Unlock()
	for _, ln := range lines {
		l.log.Warn(ln.msg, "kind", ln.kind, "count", ln.n, "repeated", true)
	}
}
