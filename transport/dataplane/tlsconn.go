package dataplane

import (
	"bufio"
	"net"
)

// recordConn is the connection beneath a data-plane TLS handshake: its
// reads are buffered, and after the handshake the connection leaves TLS
// for records (integrity.go, records.go), which check that nothing was
// left in its buffer.
type recordConn struct {
	net.Conn
	rd *bufio.Reader
}

// handshakeBuffer is the size of recordConn's read buffer: a handshake's
// messages.
const handshakeBuffer = 16 << 10

func newRecordConn(c net.Conn) *recordConn {
	return &recordConn{Conn: c, rd: bufio.NewReaderSize(c, handshakeBuffer)}
}

func (c *recordConn) Read(p []byte) (int, error) { return c.rd.Read(p) }

// writeGathered writes bufs on c; on a TCP connection under TLS, all of
// them as records with one system call (records.go).
func writeGathered(c net.Conn, bufs net.Buffers) (int64, error) {
	if mc, ok := c.(*recordLayer); ok {
		return mc.writeBuffers(bufs)
	}
	return bufs.WriteTo(c)
}

// handshakeListener puts a recordConn beneath every connection it
// accepts: the server handshakes on each (integrity.go) and then serves
// it in records.
type handshakeListener struct{ net.Listener }

func (l handshakeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newRecordConn(c), nil
}
