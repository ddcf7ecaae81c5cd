package dataplane

import (
	"bufio"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Integrity-only mode (--data-plane-privacy integrity; docs/security.md,
// docs/wire.md): a TCP connection does the mutual TLS handshake as in
// the default mode, so both ends are authenticated by certificates of
// the cluster's CA, and then carries its frames in the clear, cut into
// records that each carry an AES-GMAC tag keyed from the handshake:
//
//	record: length u32 (1 to maxMACRecord) | bytes | tag [16]
//
// The tag is AES-256-GCM's over no plaintext with the record's bytes as
// additional data (GMAC), the nonce the record's sequence number on its
// connection and direction (u64 little-endian, then four zero bytes).
// The two directions have their own keys, taken from the TLS session
// with ExportKeyingMaterial(macLabel): a record cannot be altered,
// dropped, replayed, reordered, reflected back to its sender or moved to
// another connection without its tag failing, and a record that fails
// ends the connection before any of its bytes are used. The length
// needs no tag of its own: GMAC covers the number of bytes it
// authenticates.
//
// The switch from TLS to raw records: the client sends nothing after its
// handshake until it has read the server's confirmation, macConfirm, in
// one TLS record; the server sends nothing after it until a request
// comes. So when each side leaves TLS no TLS byte is in flight or
// buffered, and the first raw byte each reads is a record's. The mode
// is negotiated by ALPN (protoIntegrity, protoEncrypt): ends that run
// different modes fail the handshake with "no application protocol".
//
// Why GMAC: with AES-NI and carry-less multiply (amd64, arm64) it tags
// several GB/s per core, over four times HMAC-SHA256 with the SHA
// extensions and about 1.6 times AES-GCM encrypting (BenchmarkTag in
// integrity_test.go).

// ALPN names of the TCP plane's two privacy modes under TLS.
const (
	protoEncrypt   = "pstrain-data/tls"
	protoIntegrity = "pstrain-data/mac"
)

const (
	// macLabel is the exporter label the MAC keys are derived with.
	macLabel = "EXPORTER-pstrain-data-integrity-v1"
	// maxMACRecord is the most bytes one record carries: a reader
	// buffers at most one record.
	maxMACRecord = 256 << 10
	macTagLen    = 16
	// macReadBuffer is the read buffer beneath the records.
	macReadBuffer = 16 << 10
	macKeyLen     = 32 // AES-256
)

// macConfirm is the server's confirmation, its last bytes over TLS.
var macConfirm = [4]byte{'P', 'S', 'I', '1'}

// errBadMAC is wrapped (with ErrBadFrame) by a record whose tag fails.
var errBadMAC = errors.New("a record's MAC does not verify: altered, replayed, reordered or from another connection")

// WithPrivacy returns a copy of a data-plane TLS configuration (client
// or server) that runs the integrity-only mode, or, with integrity
// false, full TLS; both name their mode in ALPN, so ends that disagree
// fail the handshake instead of misreading each other.
func WithPrivacy(cfg *tls.Config, integrity bool) *tls.Config {
	if cfg == nil {
		return nil
	}
	cfg = cfg.Clone()
	cfg.NextProtos = []string{protoEncrypt}
	if integrity {
		cfg.NextProtos = []string{protoIntegrity}
		cfg.SessionTicketsDisabled = true // no post-handshake messages
	}
	return cfg
}

// wantsIntegrity reports whether cfg runs the integrity-only mode.
func wantsIntegrity(cfg *tls.Config) bool {
	return cfg != nil && len(cfg.NextProtos) == 1 && cfg.NextProtos[0] == protoIntegrity
}

// explainHandshake adds the likely cause to a handshake error from ends
// whose modes differ.
func explainHandshake(err error) error {
	if err != nil && (strings.Contains(err.Error(), "no application protocol") ||
		strings.Contains(err.Error(), "unsupported application protocols")) {
		return fmt.Errorf("%w (the two ends run different --data-plane-privacy modes)", err)
	}
	return err
}

// macKeys derives the two directions' GMACs from a finished handshake.
func macKeys(cs tls.ConnectionState, client bool) (send, recv cipher.AEAD, err error) {
	if cs.NegotiatedProtocol != protoIntegrity {
		return nil, nil, fmt.Errorf("the other end does not run --data-plane-privacy integrity (ALPN %q)", cs.NegotiatedProtocol)
	}
	km, err := cs.ExportKeyingMaterial(macLabel, nil, 2*macKeyLen)
	if err != nil {
		return nil, nil, err
	}
	c2s, err := newGMAC(km[:macKeyLen])
	if err != nil {
		return nil, nil, err
	}
	s2c, err := newGMAC(km[macKeyLen:])
	if err != nil {
		return nil, nil, err
	}
	if client {
		return c2s, s2c, nil
	}
	return s2c, c2s, nil
}

func newGMAC(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// clientIntegrity finishes a client's switch to records on tc, whose
// handshake is done over rc: it waits for the server's confirmation
// (within ctx) and returns the record connection.
func clientIntegrity(ctx context.Context, tc *tls.Conn, rc *recordConn) (net.Conn, error) {
	send, recv, err := macKeys(tc.ConnectionState(), true)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(handshakeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	tc.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { tc.SetReadDeadline(time.Unix(1, 0)) })
	var m [4]byte
	_, err = io.ReadFull(tc, m[:])
	stop()
	tc.SetReadDeadline(time.Time{})
	switch {
	case err != nil:
		return nil, fmt.Errorf("waiting for the server's integrity confirmation: %w", err)
	case m != macConfirm:
		return nil, fmt.Errorf("%w: bad integrity confirmation %q", ErrBadFrame, m[:])
	}
	return newMACConn(rc, send, recv)
}

// serverIntegrity runs a server's handshake on rc under cfg, confirms
// and returns the record connection and the client's certificate name.
func serverIntegrity(rc *recordConn, cfg *tls.Config) (net.Conn, string, error) {
	tc := tls.Server(rc, cfg)
	rc.SetDeadline(time.Now().Add(handshakeTimeout))
	defer rc.SetDeadline(time.Time{})
	if err := tc.Handshake(); err != nil {
		return nil, "", explainHandshake(err)
	}
	cs := tc.ConnectionState()
	send, recv, err := macKeys(cs, false)
	if err != nil {
		return nil, "", err
	}
	if _, err := tc.Write(macConfirm[:]); err != nil {
		return nil, "", err
	}
	peer := ""
	if len(cs.PeerCertificates) > 0 {
		peer = cs.PeerCertificates[0].Subject.CommonName
	}
	mc, err := newMACConn(rc, send, recv)
	return mc, peer, err
}

// macConn carries a connection's bytes in tagged records (see above).
// Reads and writes may run concurrently with each other, not with
// themselves.
type macConn struct {
	net.Conn           // deadlines, addresses, Close
	tcp      io.Writer // where the records are written (writev on TCP)
	rd       io.Reader // where they are read (rc's buffer)

	wmu     sync.Mutex
	send    cipher.AEAD
	sendSeq uint64
	wnonce  [12]byte
	meta    []byte // the records' lengths and tags being written
	out     net.Buffers

	recv    cipher.AEAD
	recvSeq uint64
	rnonce  [12]byte
	rbuf    []byte // the record being read
	in      []byte // its bytes not yet read
	tag     [macTagLen]byte
	rerr    error // a record failed or was cut: the connection is done
}

// newMACConn switches rc to tagged records. Nothing may be buffered
// beneath TLS then (see above): that would be a peer that sent before
// its turn.
func newMACConn(rc *recordConn, send, recv cipher.AEAD) (*macConn, error) {
	if n := rc.rd.Buffered(); n > 0 {
		return nil, fmt.Errorf("%w: %d bytes sent before the switch to records", ErrBadFrame, n)
	}
	// The records are read through a buffer of their own, smaller than
	// a record: most of a large record is read straight from the socket
	// into its destination, not copied.
	return &macConn{Conn: rc, tcp: rc.Conn, rd: bufio.NewReaderSize(rc.Conn, macReadBuffer), send: send, recv: recv}, nil
}

// nonce is the nonce of record seq, in n.
func nonce(n *[12]byte, seq uint64) []byte {
	binary.LittleEndian.PutUint64(n[:], seq)
	return n[:]
}

// Write writes p in records.
func (c *macConn) Write(p []byte) (int, error) {
	n, err := c.writeBuffers(net.Buffers{p})
	return int(n), err
}

// writeBuffers writes bufs as records, each slice cut into pieces of at
// most maxMACRecord bytes, all in one writev: nothing is copied.
func (c *macConn) writeBuffers(bufs net.Buffers) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	records := 0
	for _, b := range bufs {
		records += (len(b) + maxMACRecord - 1) / maxMACRecord
	}
	if need := records * (4 + macTagLen); cap(c.meta) < need {
		c.meta = make([]byte, 0, need)
	}
	meta, out := c.meta[:0], c.out[:0]
	var total int64
	for _, b := range bufs {
		for len(b) > 0 {
			piece := b[:min(len(b), maxMACRecord)]
			b = b[len(piece):]
			start := len(meta)
			meta = binary.LittleEndian.AppendUint32(meta, uint32(len(piece)))
			meta = c.send.Seal(meta, nonce(&c.wnonce, c.sendSeq), nil, piece)
			c.sendSeq++
			out = append(out, meta[start:start+4], piece, meta[start+4:])
			total += int64(len(piece))
		}
	}
	c.out = out[:0]
	if _, err := out.WriteTo(c.tcp); err != nil {
		return 0, err
	}
	return total, nil
}

// rawReader is the connection's bytes beneath the records: after a
// refusal, linger drains them unchecked (a record that failed its MAC
// would stop a drain through Read at once, and the close that followed
// would reset the connection over the refusal just written).
func (c *macConn) rawReader() io.Reader { return c.rd }

// CloseWrite half-closes the connection (after a refusal, linger).
func (c *macConn) CloseWrite() error {
	if cw, ok := c.tcp.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Read reads the records' bytes, each record only once its tag
// verified. A record that fits in p is read straight into it.
func (c *macConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.in) == 0 {
		n, err := c.next(p)
		if err != nil || n > 0 {
			return n, err
		}
	}
	n := copy(p, c.in)
	c.in = c.in[n:]
	return n, nil
}

// next reads and verifies the next record: into p when it fits (n is its
// length), else into the connection's buffer (c.in). A record that fails
// its tag, or is cut, ends the connection (every later read fails); a
// read that times out before a record starts does not.
func (c *macConn) next(p []byte) (n int, err error) {
	if c.rerr != nil {
		return 0, c.rerr
	}
	var h [4]byte
	if got, err := io.ReadFull(c.rd, h[:]); err != nil {
		if got > 0 {
			c.rerr = err
		}
		return 0, err
	}
	u := binary.LittleEndian.Uint32(h[:])
	if u == 0 || u > maxMACRecord {
		c.rerr = fmt.Errorf("%w: a record of %d bytes (1 to %d)", ErrBadFrame, u, maxMACRecord)
		return 0, c.rerr
	}
	size := int(u)
	dst := p
	if len(p) < size {
		c.rbuf = grow(c.rbuf, size)
		dst = c.rbuf
	}
	dst = dst[:size]
	if err := c.readRest(dst); err != nil {
		return 0, err
	}
	if err := c.readRest(c.tag[:]); err != nil {
		return 0, err
	}
	if _, err := c.recv.Open(nil, nonce(&c.rnonce, c.recvSeq), c.tag[:], dst); err != nil {
		c.rerr = fmt.Errorf("%w: record %d: %w", ErrBadFrame, c.recvSeq, errBadMAC)
		return 0, c.rerr
	}
	c.recvSeq++
	if len(p) >= size {
		return size, nil
	}
	c.in = dst
	return 0, nil
}

// readRest reads the rest of a record into b: the connection ends
// there if it fails, and an end of the stream is unexpected.
func (c *macConn) readRest(b []byte) error {
	_, err := io.ReadFull(c.rd, b)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		c.rerr = err
	}
	return err
}
