package dataplane

import (
	"bufio"
	"crypto/tls"
	"net"
	"sync"
)

// TLS on the TCP plane, without the costs that are not the cipher's.
// crypto/tls writes every record (at most 16 KiB of payload) with its own
// write system call and reads a record or so per read call, so a 1.3 MB
// push or pull costs about 80 system calls each way, each a trip into
// the kernel and often a wake-up of the other end: on the profile of a
// TLS push+pull (BENCHMARKS.md, "Mutual TLS at full speed") the system
// calls took more CPU than AES-GCM itself. Beneath the TLS connection,
// recordConn gathers the records of one frame into writes of up to
// recordBatch bytes, and reads the socket through a buffer of the same
// size, so a frame costs a few system calls as on plain TCP.

// recordBatch is how many bytes of records recordConn gathers before it
// writes, and the size of its read buffer.
const recordBatch = 256 << 10

// recordConn is the connection beneath a data-plane TLS connection: its
// writes are gathered while a frame is being written (gather, flush),
// and its reads buffered.
type recordConn struct {
	net.Conn
	rd *bufio.Reader

	// crypto/tls writes under its own lock, but a read may write too (a
	// key update's answer): mu orders the batch against such a write.
	mu     sync.Mutex
	out    []byte
	gather bool
}

func newRecordConn(c net.Conn) *recordConn {
	return &recordConn{Conn: c, rd: bufio.NewReaderSize(c, recordBatch)}
}

func (c *recordConn) Read(p []byte) (int, error) { return c.rd.Read(p) }

// Write writes p, or while gathering appends it to the batch, writing
// the batch out first when p would not fit.
func (c *recordConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.gather {
		return c.Conn.Write(p)
	}
	if len(c.out)+len(p) > recordBatch {
		if err := c.flush(); err != nil {
			return 0, err
		}
	}
	if len(p) >= recordBatch {
		return c.Conn.Write(p)
	}
	if c.out == nil {
		c.out = make([]byte, 0, recordBatch)
	}
	c.out = append(c.out, p...)
	return len(p), nil
}

// setGather starts or stops gathering; stopping writes the batch.
func (c *recordConn) setGather(on bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gather = on
	if on {
		return nil
	}
	return c.flush()
}

// flush writes the gathered bytes. Call with mu.
func (c *recordConn) flush() error {
	if len(c.out) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.out)
	c.out = c.out[:0]
	return err
}

// writeGathered writes bufs on c; when c is a data-plane TLS connection,
// its records go out in batches (recordConn) and are all written when it
// returns, and on an integrity-only connection in one writev.
func writeGathered(c net.Conn, bufs net.Buffers) (int64, error) {
	if mc, ok := c.(*macConn); ok {
		return mc.writeBuffers(bufs) // integrity-only: records in one writev (integrity.go)
	}
	tc, ok := c.(*tls.Conn)
	if !ok {
		return bufs.WriteTo(c)
	}
	rc, ok := tc.NetConn().(*recordConn)
	if !ok {
		return bufs.WriteTo(c)
	}
	rc.setGather(true)
	n, err := bufs.WriteTo(c)
	if ferr := rc.setGather(false); err == nil {
		err = ferr
	}
	return n, err
}

// recordListener puts a recordConn beneath every connection it accepts
// (wrap it with tls.NewListener).
type recordListener struct{ net.Listener }

func (l recordListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return newRecordConn(tc), nil
	}
	return c, nil
}

// fullRecords is cfg for the data plane: full-size records from the
// first byte (crypto/tls otherwise starts a connection with small ones).
func fullRecords(cfg *tls.Config) *tls.Config {
	cfg = cfg.Clone()
	cfg.DynamicRecordSizingDisabled = true
	return cfg
}

// handshakeListener puts a recordConn beneath every connection it
// accepts, whatever its kind: the integrity-only mode's server
// handshakes on each (integrity.go), and serves none without.
type handshakeListener struct{ net.Listener }

func (l handshakeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newRecordConn(c), nil
}
