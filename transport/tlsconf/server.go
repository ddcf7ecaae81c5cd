package tlsconf

import (
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials are gRPC credentials for a task's server. Refused
// handshakes (no client certificate, one from another CA, plaintext) are
// logged on log — gRPC itself drops them silently — at most once per
// every seconds, with the number suppressed in between. now may be nil
// (time.Now).
func (c *Config) ServerCredentials(log *slog.Logger, every time.Duration, now func() time.Time) credentials.TransportCredentials {
	if now == nil {
		now = time.Now
	}
	return &loggingCreds{TransportCredentials: credentials.NewTLS(c.ServerTLS()), lim: &limiter{log: log, every: every, now: now}}
}

// loggingCreds logs failed server handshakes.
type loggingCreds struct {
	credentials.TransportCredentials
	lim *limiter
}

func (l *loggingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := l.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		l.lim.refused(raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (l *loggingCreds) Clone() credentials.TransportCredentials {
	return &loggingCreds{TransportCredentials: l.TransportCredentials.Clone(), lim: l.lim}
}

// limiter rate-limits the refused-handshake log.
type limiter struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *limiter) refused(remote net.Addr, err error) {
	if l.log == nil {
		return
	}
	l.mu.Lock()
	t := l.now()
	if !l.last.IsZero() && t.Sub(l.last) < l.every {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.last, l.suppressed = t, 0
	l.mu.Unlock()
	from := "?"
	if remote != nil {
		from = remote.String()
	}
	l.log.Warn("TLS handshake refused", "remote", from, "err", err, "suppressed_since_last", n)
}
