package dataplane

import (
	"bufio"
	"io"
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

// readFull fills p from rd, a buffered reader over conn, as io.ReadFull:
// on a TCP connection under TLS, what rd does not hold already is read
// as a full read of the records (recordsread.go), its records opened by
// two goroutines while the next are read.
func readFull(rd *bufio.Reader, conn net.Conn, p []byte) error {
	mc, ok := conn.(*recordLayer)
	if !ok {
		_, err := io.ReadFull(rd, p)
		return err
	}
	n := 0
	if b := rd.Buffered(); b > 0 {
		n, _ = rd.Read(p[:min(b, len(p))]) // from rd's buffer: no read beneath
	}
	err := mc.readFull(p[n:])
	if err == io.EOF && n > 0 {
		err = io.ErrUnexpectedEOF
	}
	return err
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
