package netlab

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// TestShaperAdmit checks the rate limit's arithmetic on an injected
// clock: back-to-back frames leave one serialization time apart, an idle
// link sends at once, and a frame that would wait longer than the queue
// allows is dropped without moving the link's clock.
func TestShaperAdmit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s shaper
	// 1250 bytes at 100 Mbit/s: 100 us each.
	for i := 1; i <= 3; i++ {
		due, ok := s.admit(t0, 1250, 1e8, time.Millisecond)
		if want := t0.Add(time.Duration(i) * 100 * time.Microsecond); !ok || !due.Equal(want) {
			t.Fatalf("frame %d: due %v ok %v, want %v", i, due.Sub(t0), ok, want.Sub(t0))
		}
	}
	// 300 us queued, 1 ms allowed: 7 more fit (the queue then holds 1 ms).
	for range 7 {
		if _, ok := s.admit(t0, 1250, 1e8, time.Millisecond); !ok {
			t.Fatal("dropped a frame the queue had room for")
		}
	}
	if _, ok := s.admit(t0, 1250, 1e8, 999*time.Microsecond); ok {
		t.Fatal("admitted a frame past the queue's limit")
	}
	if !s.free.Equal(t0.Add(time.Millisecond)) {
		t.Fatalf("link free at %v after a drop, want 1ms", s.free.Sub(t0))
	}
	// Idle link: a frame arriving after the queue drained leaves at once
	// plus its own serialization time.
	later := t0.Add(time.Second)
	if due, ok := s.admit(later, 125, 1e8, time.Millisecond); !ok || !due.Equal(later.Add(10*time.Microsecond)) {
		t.Fatalf("idle link: due %v ok %v", due.Sub(later), ok)
	}
	if due, ok := s.admit(later, 1<<20, 0, 0); !ok || !due.Equal(later) {
		t.Fatalf("no rate: due %v ok %v, want now", due.Sub(later), ok)
	}
}

// TestRateLimit sends 4 MB through a LinkWire link limited to
// 100 Mbit/s and reads it back: the bulk transfer takes about the
// time the rate allows each way (the echo runs both directions at once),
// and without the limit it is faster.
func TestRateLimit(t *testing.T) {
	l := lab(t, Config{Hosts: 1, Link: LinkWire, MTU: 9000})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	h := l.Hosts[0]
	addr := net.JoinHostPort(h.IP, "7777")
	cmd := h.Command(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), "NETLAB_ECHO="+addr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitEcho(t, ctx, addr)
	const size = 4 << 20
	free := bulkEcho(t, addr, size)
	if err := l.Impair(ctx, h, Impairment{Rate: 1e8, Delay: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	limited := bulkEcho(t, addr, size)
	ideal := time.Duration(float64(size*8) / 1e8 * float64(time.Second))
	t.Logf("4 MB echoed: %v unlimited, %v at 100 Mbit/s (%.0f Mbit/s; the rate alone allows %v)",
		free, limited, float64(size*8)/limited.Seconds()/1e6, ideal)
	if limited < ideal*9/10 || limited > 4*ideal {
		t.Errorf("4 MB at 100 Mbit/s took %v, want about %v", limited, ideal)
	}
	if free >= limited {
		t.Errorf("unlimited %v not faster than limited %v", free, limited)
	}
}

// bulkEcho writes size bytes to the echo server at addr while reading
// them back, and returns the time until the last byte came back.
func bulkEcho(t *testing.T, addr string, size int) time.Duration {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	t0 := time.Now()
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, werr = c.Write(make([]byte, size))
	}()
	n, rerr := io.CopyN(io.Discard, c, int64(size))
	d := time.Since(t0)
	wg.Wait()
	if werr != nil || rerr != nil {
		t.Fatalf("echo of %d bytes: wrote: %v, read %d: %v", size, werr, n, rerr)
	}
	return d
}
