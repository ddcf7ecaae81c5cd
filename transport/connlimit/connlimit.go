// Package connlimit bounds the connections a listener serves at once.
// Unlike golang.org/x/net/netutil.LimitListener, which stops accepting at
// the limit (new connections then wait in the kernel's backlog, and the
// clients' dials hang), a connection past the limit is accepted and
// closed at once, and reported: a client sees the connection closed, a
// retrying one (gRPC's) backs off, and an operator sees the count.
package connlimit

import (
	"net"
	"sync"
)

// Listener is a net.Listener serving at most a fixed number of
// connections at once.
type Listener struct {
	net.Listener
	slots   chan struct{}
	refused func(net.Conn)
}

// New wraps l: at most n of the connections Accept returns are open at
// once (a connection's slot is freed when it is closed). One accepted
// past the limit is passed to refused (may be nil), which must not
// block, and closed. n < 1 is taken as 1.
func New(l net.Listener, n int, refused func(net.Conn)) *Listener {
	if refused == nil {
		refused = func(net.Conn) {}
	}
	return &Listener{Listener: l, slots: make(chan struct{}, max(n, 1)), refused: refused}
}

// Accept returns the next connection within the limit.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &conn{Conn: c, free: func() { <-l.slots }}, nil
		default:
			l.refused(c)
			c.Close()
		}
	}
}

// Open is the number of connections open.
func (l *Listener) Open() int { return len(l.slots) }

// conn frees its slot on the first Close.
type conn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}
