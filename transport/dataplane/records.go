package dataplane

import (
	"bufio"
	"bytes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
)

// The records a TCP connection under TLS carries after its handshake
// (integrity.go; docs/wire.md, "Records"):
//
//	record: length u32 (1 to maxRecord) | bytes | tag [16]
//
// In the encrypt mode the bytes are the record's AES-128-GCM ciphertext
// and the tag its GCM tag; in the integrity mode the bytes are the
// record's own, in the clear, and the tag AES-256-GCM's over no
// plaintext with the bytes as additional data (GMAC). The nonce is the
// record's sequence number on its connection and direction (u64
// little-endian, then four zero bytes), the two directions have their
// own keys and each connection its own: a record cannot be altered,
// dropped, replayed, reordered, reflected back to its sender or moved
// to another connection without its tag failing, and a record that
// fails ends the connection before any of its bytes are used. The
// length needs no tag of its own: GCM authenticates the number of bytes
// it covers.
//
// Every rekeyEvery records a direction's key is replaced by the next,
// HKDF-Expand(SHA-256) of it with the label rekeyLabel, as TLS 1.3's key
// update derives its next traffic secret: no key seals more than
// rekeyEvery records of at most 256 KiB (2^38 bytes), inside AES-GCM's
// usage limits (RFC 8446 §5.5), and the old key is zeroed.
//
// Each record has its own nonce, so records are sealed independently:
// a large write's records are sealed by two goroutines at once, into
// the buffer that is then written with one system call; a record is
// read straight into the reader's buffer when it fits there and opened
// in place.

const (
	// maxRecord is the most bytes one record carries: a reader buffers
	// at most one record.
	maxRecord = 256 << 10
	// sealRecord is how many bytes the encrypt mode puts in a record: a
	// frame of a push or pull is cut into enough records to share
	// between two sealers.
	sealRecord = 64 << 10
	// parallelSeal is the least a write carries for its records to be
	// sealed by two goroutines.
	parallelSeal = 128 << 10
	// sealChunk is the plaintext a sealed write seals into its buffer
	// before it writes: what bounds the buffer a connection keeps.
	sealChunk = 1 << 20
	macTagLen = 16
	// recordReadBuffer is the read buffer beneath the records.
	recordReadBuffer = 16 << 10
	// rekeyEvery is how many records a key seals (see above).
	rekeyEvery = 1 << 20
	rekeyLabel = "pstrain-data next key"
)

// recordLayer carries a connection's bytes in records (see above). Reads
// and writes may run concurrently with each other, not with themselves.
type recordLayer struct {
	net.Conn           // deadlines, addresses, Close
	tcp      io.Writer // where the records are written (writev on TCP)
	rd       io.Reader // where they are read (rc's buffer)
	sealed   bool      // encrypt mode: records sealed, not only tagged

	rekey uint64 // records per key: rekeyEvery

	wmu     sync.Mutex
	sendKey []byte
	send    *[2]cipher.AEAD // one per sealer
	sendSeq uint64
	wnonce  [12]byte
	meta    []byte // integrity: the records' lengths and tags being written
	out     net.Buffers
	wbuf    []byte    // encrypt: the sealed records being written
	jobs    []sealJob // encrypt: the records being sealed
	pieces  [][]byte  // encrypt: the pieces of plaintext of the chunk being sealed

	recvKey []byte
	recv    cipher.AEAD
	recvSeq uint64
	rnonce  [12]byte
	rbuf    []byte // the record being read
	in      []byte // its bytes not yet read
	tag     [macTagLen]byte
	rerr    error // a record failed or was cut: the connection is done
}

// sealJob is one record to seal: its plaintext, sequence number and
// where its ciphertext and tag go.
type sealJob struct {
	keys  *[2]cipher.AEAD // its key's, one per sealer
	seq   uint64
	plain []byte
	out   []byte // len(plain)+macTagLen bytes
}

// switchToRecords switches rc to records under keys. Nothing may be buffered
// beneath TLS then (see integrity.go): that would be a peer that sent
// before its turn.
func switchToRecords(rc *recordConn, keys recordKeys) (*recordLayer, error) {
	if n := rc.rd.Buffered(); n > 0 {
		return nil, fmt.Errorf("%w: %d bytes sent before the switch to records", ErrBadFrame, n)
	}
	c, err := newRecordLayer(keys, rc.Conn, bufio.NewReaderSize(rc.Conn, recordReadBuffer))
	if err != nil {
		return nil, err
	}
	// The records are read through a buffer of their own, smaller than
	// a record: most of a large record is read straight from the socket
	// into its destination, not copied.
	c.Conn = rc
	return c, nil
}

// newRecordLayer is a record connection writing to w and reading from r.
// The layer keeps copies of the keys, which it zeroes when it moves on
// to the next.
func newRecordLayer(keys recordKeys, w io.Writer, r io.Reader) (*recordLayer, error) {
	c := &recordLayer{tcp: w, rd: r, sealed: keys.sealed, rekey: rekeyEvery,
		sendKey: bytes.Clone(keys.send), recvKey: bytes.Clone(keys.recv)}
	send, err := sealers(c.sendKey)
	if err != nil {
		return nil, err
	}
	c.send = send
	if c.recv, err = newGCM(c.recvKey); err != nil {
		return nil, err
	}
	return c, nil
}

// sealers are two AEADs under key, one per sealing goroutine.
func sealers(key []byte) (*[2]cipher.AEAD, error) {
	var s [2]cipher.AEAD
	for i := range s {
		a, err := newGCM(key)
		if err != nil {
			return nil, err
		}
		s[i] = a
	}
	return &s, nil
}

// nextKey is the key that follows key (see above); key is zeroed once
// the next is derived (the AEADs under it keep their own key schedule
// until the records they seal or open are done).
func nextKey(key []byte) ([]byte, error) {
	k, err := hkdf.Expand(sha256.New, key, rekeyLabel, len(key))
	if err != nil {
		return nil, err
	}
	clear(key)
	return k, nil
}

// rekeySend moves the sending side to its next key when record seq
// starts one. Call with wmu.
func (c *recordLayer) rekeySend(seq uint64) error {
	if seq == 0 || seq%c.rekey != 0 {
		return nil
	}
	k, err := nextKey(c.sendKey)
	if err != nil {
		return err
	}
	send, err := sealers(k)
	if err != nil {
		return err
	}
	c.sendKey, c.send = k, send
	return nil
}

// rekeyRecv moves the reading side to its next key when record seq
// starts one.
func (c *recordLayer) rekeyRecv(seq uint64) error {
	if seq == 0 || seq%c.rekey != 0 {
		return nil
	}
	k, err := nextKey(c.recvKey)
	if err != nil {
		return err
	}
	a, err := newGCM(k)
	if err != nil {
		return err
	}
	c.recvKey, c.recv = k, a
	return nil
}

// nonce is the nonce of record seq, in n.
func nonce(n *[12]byte, seq uint64) []byte {
	binary.LittleEndian.PutUint64(n[:], seq)
	return n[:]
}

// Write writes p in records.
func (c *recordLayer) Write(p []byte) (int, error) {
	n, err := c.writeBuffers(net.Buffers{p})
	return int(n), err
}

// writeBuffers writes bufs as records, each slice cut into records, all
// in one system call.
func (c *recordLayer) writeBuffers(bufs net.Buffers) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.sealed {
		return c.writeSealed(bufs)
	}
	return c.writeTagged(bufs)
}

// writeTagged writes bufs as tagged records in the clear, each slice
// cut into pieces of at most maxRecord bytes, in one writev: the bytes
// are not copied.
func (c *recordLayer) writeTagged(bufs net.Buffers) (int64, error) {
	records := 0
	for _, b := range bufs {
		records += (len(b) + maxRecord - 1) / maxRecord
	}
	if need := records * (4 + macTagLen); cap(c.meta) < need {
		c.meta = make([]byte, 0, need)
	}
	meta, out := c.meta[:0], c.out[:0]
	var total int64
	for _, b := range bufs {
		for len(b) > 0 {
			piece := b[:min(len(b), maxRecord)]
			b = b[len(piece):]
			if err := c.rekeySend(c.sendSeq); err != nil {
				return 0, err
			}
			start := len(meta)
			meta = binary.LittleEndian.AppendUint32(meta, uint32(len(piece)))
			meta = c.send[0].Seal(meta, nonce(&c.wnonce, c.sendSeq), nil, piece)
			c.sendSeq++
			out = append(out, meta[start:start+4], piece, meta[start+4:])
			total += int64(len(piece))
		}
	}
	c.out = out[:0]
	_, err := out.WriteTo(c.tcp)
	clear(c.out[:cap(c.out)]) // (kept for the next write: hold no caller's buffer)
	if err != nil {
		return 0, err
	}
	return total, nil
}

// writeSealed seals bufs into records of at most sealRecord bytes and
// writes them, sealChunk bytes of plaintext at a time: the records of a
// chunk are laid out one after another in the write buffer, which so
// never holds more than a chunk whatever the write's size (a pull
// answer is a whole shard).
func (c *recordLayer) writeSealed(bufs net.Buffers) (int64, error) {
	var total int64
	pieces, n := c.pieces[:0], 0
	for _, b := range bufs {
		for len(b) > 0 {
			piece := b[:min(len(b), sealRecord)]
			b = b[len(piece):]
			pieces, n = append(pieces, piece), n+len(piece)
			if n < sealChunk {
				continue
			}
			if err := c.sealAndWrite(pieces); err != nil {
				return 0, err
			}
			total += int64(n)
			pieces, n = pieces[:0], 0
		}
	}
	if len(pieces) > 0 {
		if err := c.sealAndWrite(pieces); err != nil {
			return 0, err
		}
		total += int64(n)
	}
	clear(pieces[:cap(pieces)]) // (kept for the next write: hold no caller's buffer)
	c.pieces = pieces[:0]
	return total, nil
}

// sealAndWrite seals pieces (each at most sealRecord bytes) into
// records laid out in the write buffer, one after another, and writes
// them.
func (c *recordLayer) sealAndWrite(pieces [][]byte) error {
	size, total := 0, 0
	for _, p := range pieces {
		size += 4 + len(p) + macTagLen
		total += len(p)
	}
	c.wbuf = grow(c.wbuf, size)
	jobs, at := c.jobs[:0], 0
	for _, piece := range pieces {
		if err := c.rekeySend(c.sendSeq); err != nil {
			return err
		}
		binary.LittleEndian.PutUint32(c.wbuf[at:], uint32(len(piece)))
		at += 4
		jobs = append(jobs, sealJob{keys: c.send, seq: c.sendSeq, plain: piece, out: c.wbuf[at : at+len(piece)+macTagLen]})
		at += len(piece) + macTagLen
		c.sendSeq++
	}
	c.sealAll(jobs, total)
	clear(jobs) // (kept for the next chunk: hold no caller's buffer)
	c.jobs = jobs[:0]
	_, err := c.tcp.Write(c.wbuf[:size])
	return err
}

// sealAll seals jobs (total plaintext bytes), by two goroutines when
// there are enough bytes to share, each with AEADs of its own.
func (c *recordLayer) sealAll(jobs []sealJob, total int) {
	if total < parallelSeal || len(jobs) < 2 {
		sealJobs(0, jobs)
		return
	}
	split, half := 0, 0
	for split < len(jobs)-1 && half < total/2 {
		half += len(jobs[split].plain)
		split++
	}
	var wg sync.WaitGroup
	wg.Go(func() { sealJobs(1, jobs[split:]) })
	sealJobs(0, jobs[:split])
	wg.Wait()
}

// sealJobs seals each job's plaintext into its out with its key's AEAD
// of sealer i.
func sealJobs(i int, jobs []sealJob) {
	var n [12]byte
	for _, j := range jobs {
		j.keys[i].Seal(j.out[:0], nonce(&n, j.seq), j.plain, nil)
	}
}

// rawReader is the connection's bytes beneath the records: after a
// refusal, linger drains them unchecked (a record that failed its MAC
// would stop a drain through Read at once, and the close that followed
// would reset the connection over the refusal just written).
func (c *recordLayer) rawReader() io.Reader { return c.rd }

// CloseWrite half-closes the connection (after a refusal, linger).
func (c *recordLayer) CloseWrite() error {
	if cw, ok := c.tcp.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Read reads the records' bytes, each record only once its tag
// verified. A record that fits in p is read straight into it.
func (c *recordLayer) Read(p []byte) (int, error) {
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
func (c *recordLayer) next(p []byte) (n int, err error) {
	if c.rerr != nil {
		return 0, c.rerr
	}
	size, err := c.header()
	if err != nil {
		return 0, err
	}
	if err := c.rekeyRecv(c.recvSeq); err != nil {
		c.rerr = err
		return 0, err
	}
	// The encrypt mode opens in place, the tag after the ciphertext.
	room := size
	if c.sealed {
		room += macTagLen
	}
	dst := p
	if len(p) < room {
		c.rbuf = grow(c.rbuf, room)
		dst = c.rbuf
	}
	if err := c.open(dst[:room], size); err != nil {
		return 0, err
	}
	c.recvSeq++
	if len(p) >= room {
		return size, nil
	}
	c.in = dst[:size]
	return 0, nil
}

// header reads a record's length.
func (c *recordLayer) header() (int, error) {
	var h [4]byte
	if got, err := io.ReadFull(c.rd, h[:]); err != nil {
		if got > 0 {
			c.rerr = err
		}
		return 0, err
	}
	u := binary.LittleEndian.Uint32(h[:])
	if u == 0 || u > maxRecord {
		c.rerr = fmt.Errorf("%w: a record of %d bytes (1 to %d)", ErrBadFrame, u, maxRecord)
		return 0, c.rerr
	}
	return int(u), nil
}

// open reads the rest of a record of size bytes into dst (its bytes,
// and in the encrypt mode its tag after them) and verifies it: sealed,
// it is decrypted in place. On any failure dst is cleared: it may be the
// caller's buffer (a pull read straight into the model's parameters),
// which must never keep bytes no tag verified.
func (c *recordLayer) open(dst []byte, size int) error {
	err := c.openRecord(dst, size)
	if err != nil {
		clear(dst)
	}
	return err
}

func (c *recordLayer) openRecord(dst []byte, size int) error {
	if err := c.readRest(dst); err != nil {
		return err
	}
	var err error
	if c.sealed {
		_, err = c.recv.Open(dst[:0], nonce(&c.rnonce, c.recvSeq), dst, nil)
	} else {
		if err := c.readRest(c.tag[:]); err != nil {
			return err
		}
		_, err = c.recv.Open(nil, nonce(&c.rnonce, c.recvSeq), c.tag[:], dst[:size])
	}
	if err != nil {
		c.rerr = fmt.Errorf("%w: record %d: %w", ErrBadFrame, c.recvSeq, errBadMAC)
		return c.rerr
	}
	return nil
}

// readRest reads the rest of a record into b: the connection ends
// there if it fails, and an end of the stream is unexpected.
func (c *recordLayer) readRest(b []byte) error {
	_, err := io.ReadFull(c.rd, b)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		c.rerr = err
	}
	return err
}
