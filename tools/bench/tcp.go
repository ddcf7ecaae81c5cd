package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// TCPEcho measures raw loopback TCP: the client sends payload bytes, a
// server goroutine reads all of them and sends them back, for budget (at
// least minRounds round trips). It returns the bytes moved both ways per
// second, the ceiling a push+pull of the same payload over gRPC is
// compared with. The listener, connection and server goroutine are gone
// when it returns.
func TCPEcho(ctx context.Context, now Clock, payload int, budget time.Duration, minRounds int) (bytesPerSec float64, err error) {
	if payload <= 0 {
		return 0, fmt.Errorf("bench: tcp payload must be positive, got %d", payload)
	}
	if now == nil {
		now = time.Now
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("bench: tcp listener: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := lis.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, payload)
		for {
			// The client closing its end (EOF or reset) ends the loop;
			// the client reports its own errors.
			if _, err := io.ReadFull(conn, buf); err != nil {
				return
			}
			if _, err := conn.Write(buf); err != nil {
				return
			}
		}
	}()
	defer wg.Wait()
	defer lis.Close()

	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", lis.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("bench: tcp dial: %w", err)
	}
	// Closing the connection ends the server loop; a context end closes it
	// early so a blocked read returns.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	out := make([]byte, payload)
	for i := range out {
		out[i] = byte(i)
	}
	in := make([]byte, payload)
	round := func() error {
		if _, err := conn.Write(out); err != nil {
			return err
		}
		_, err := io.ReadFull(conn, in)
		return err
	}
	if err := round(); err != nil { // warm-up: buffers, window growth
		conn.Close()
		return 0, fmt.Errorf("bench: tcp echo: %w", err)
	}
	n, d2, err := loop(ctx, now, budget, minRounds, round)
	conn.Close()
	if err != nil {
		return 0, fmt.Errorf("bench: tcp echo: %w", err)
	}
	return rate(float64(2*payload*n), d2), nil
}
