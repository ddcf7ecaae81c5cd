package connlimit

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// closedWithin reports whether the server closed c (EOF) within d;
// false if it stayed open.
func closedWithin(t *testing.T, c net.Conn, d time.Duration) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return false
	}
	t.Fatalf("read: %v", err)
	return false
}

func TestConnectionsPastTheLimitAreClosedAndCounted(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int32
	l := New(raw, 2, func(net.Conn) { refused.Add(1) })
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := dial(), dial()
	s1, s2 := <-accepted, <-accepted
	if l.Open() != 2 {
		t.Fatalf("open %d, want 2", l.Open())
	}
	// The third is closed by the server at once, and counted.
	if c := dial(); !closedWithin(t, c, 10*time.Second) {
		t.Fatal("a connection past the limit stayed open")
	}
	if refused.Load() != 1 {
		t.Fatalf("refused %d, want 1", refused.Load())
	}
	// The first two are served.
	if closedWithin(t, a, 50*time.Millisecond) || closedWithin(t, b, 50*time.Millisecond) {
		t.Fatal("a connection within the limit was closed")
	}
	// Closing one (twice: the slot is freed once) makes room for one more.
	s1.Close()
	s1.Close()
	d := dial()
	s3 := <-accepted
	if l.Open() != 2 {
		t.Fatalf("open %d after closing one and accepting one, want 2", l.Open())
	}
	if closedWithin(t, d, 50*time.Millisecond) {
		t.Fatal("the connection taking a freed slot was closed")
	}
	if c := dial(); !closedWithin(t, c, 10*time.Second) || refused.Load() != 2 {
		t.Fatalf("past the limit again: refused %d, want 2", refused.Load())
	}
	s2.Close()
	s3.Close()
	if l.Open() != 0 {
		t.Fatalf("open %d after closing all, want 0", l.Open())
	}
}
