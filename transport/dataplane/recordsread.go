package dataplane

import (
	"crypto/cipher"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// A full read (readFull) is one whose caller needs all of p before it
// uses any of it: a push's gradient, a pull's parameters. Its records
// are read ahead of their opening and opened by two goroutines, while
// the next records come off the socket:
//
//   - the reading goroutine reads each record whole (its ciphertext and
//     tag, and the next record's length when more must follow) into
//     one of openSlots read-ahead slots, and hands it to opener k%2 for
//     the record k of the read; the encrypt mode opens it out of the
//     slot into its place in p, the integrity mode reads its bytes
//     straight into p and only its tag into the slot;
//   - each record is opened under its own sequence number and its key's
//     AEAD of that opener (the reader moves the keys on, as a serial
//     read does, before it hands the record over);
//   - readFull returns only once both openers are done: if any record
//     failed its tag, or the stream broke, the connection is done and
//     all of p is cleared, so the caller never holds a byte no tag
//     verified.

// openJob is one record of a full read to open.
type openJob struct {
	keys *[2]cipher.AEAD // its key's, one per opener
	seq  uint64
	dst  []byte // its place in the caller's buffer (integrity: its bytes, read there)
	src  []byte // encrypt: its ciphertext and tag; integrity: its tag
	slot int    // the read-ahead slot src is in
}

// openers are the two goroutines that open a full read's records: the
// jobs of record k go to opener k%2, and each gives its slot back when
// the record is opened (or skipped once one failed).
type openers struct {
	jobs   [2]chan openJob
	free   chan int // read-ahead slots not in use
	failed atomic.Bool
	badMu  sync.Mutex
	bad    uint64 // the first record that failed its tag
	wg     sync.WaitGroup
}

// startOpeners starts the openers of a full read in mode sealed.
func startOpeners(sealed bool) *openers {
	o := &openers{free: make(chan int, openSlots)}
	for i := range openSlots {
		o.free <- i
	}
	for i := range o.jobs {
		o.jobs[i] = make(chan openJob, openSlots)
		o.wg.Go(func() { o.run(i, sealed) })
	}
	return o
}

// run opens the jobs of opener i until its channel is closed.
func (o *openers) run(i int, sealed bool) {
	for j := range o.jobs[i] {
		if !o.failed.Load() && !j.open(i, sealed) {
			o.fail(j.seq)
		}
		o.free <- j.slot
	}
}

// open verifies j with its key's AEAD of opener i: sealed, it decrypts
// out of its slot into its place.
func (j openJob) open(i int, sealed bool) bool {
	var n [12]byte
	var err error
	if sealed {
		_, err = j.keys[i].Open(j.dst[:0], nonce(&n, j.seq), j.src, nil)
	} else {
		_, err = j.keys[i].Open(nil, nonce(&n, j.seq), j.src, j.dst)
	}
	return err == nil
}

func (o *openers) fail(seq uint64) {
	o.badMu.Lock()
	defer o.badMu.Unlock()
	if !o.failed.Load() {
		o.bad = seq
		o.failed.Store(true)
	}
}

// finish stops the openers once they are done, and returns the error of
// a record that failed its tag.
func (o *openers) finish() error {
	for _, ch := range o.jobs {
		close(ch)
	}
	o.wg.Wait()
	if o.failed.Load() {
		return fmt.Errorf("%w: record %d: %w", ErrBadFrame, o.bad, errBadMAC)
	}
	return nil
}

// readFull fills p with the records' bytes, all of them verified, as
// io.ReadFull would: a full read (see above). Any error ends the
// connection and clears p.
func (c *recordLayer) readFull(p []byte) error {
	if c.rerr != nil {
		return c.rerr
	}
	err := c.fill(p)
	if err == nil {
		return nil
	}
	clear(p)
	if c.rerr == nil {
		c.rerr = err
	}
	return err
}

// fill is readFull but for the clearing. As io.ReadFull, an end of the
// stream before any byte is io.EOF, after some io.ErrUnexpectedEOF.
func (c *recordLayer) fill(p []byte) error {
	n := copy(p, c.in)
	c.in = c.in[n:]
	rest := p[n:]
	var err error
	if len(rest) >= parallelOpen {
		rest, err = c.openAhead(rest)
	}
	if err == nil {
		_, err = io.ReadFull(c, rest)
	}
	if err == io.EOF && len(rest) < len(p) {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// openAhead reads the records that fit whole in p into it, opened by the
// openers, and returns the rest of p. A record larger than the rest is
// left to the serial read, its length already read.
func (c *recordLayer) openAhead(p []byte) ([]byte, error) {
	o := startOpeners(c.sealed)
	rest, size, err := c.dispatch(o, p)
	if ferr := o.finish(); ferr != nil {
		err = ferr // the bad record comes first: what broke after is its consequence
	}
	if err != nil || size == 0 {
		return rest, err
	}
	n, err := c.body(rest, size)
	if err != nil {
		return nil, err
	}
	if n == 0 { // it did not fit: the serial read copies it
		n = copy(rest, c.in)
		c.in = c.in[n:]
	}
	return rest[n:], nil
}

// dispatch reads the records that fit in p and hands them to o; it
// returns the rest of p and the length of the next record if it was
// read but does not fit.
func (c *recordLayer) dispatch(o *openers, p []byte) (rest []byte, next int, err error) {
	size, err := c.header()
	if err != nil {
		return p, 0, err // nothing read: an end of the stream here is io.EOF
	}
	for k := 0; ; k++ {
		if size > len(p) {
			return p, size, nil
		}
		if err := c.rekeyRecv(c.recvSeq); err != nil {
			return nil, 0, err
		}
		more := size < len(p) // another record follows: read its length too
		j, h, err := c.readAhead(o, p[:size], more)
		if err != nil {
			return nil, 0, err
		}
		o.jobs[k%2] <- j
		c.recvSeq++
		p = p[size:]
		if !more {
			return p, 0, nil
		}
		if size, err = c.parseHeader(h); err != nil {
			return nil, 0, err
		}
		if o.failed.Load() {
			return nil, 0, nil // finish says why
		}
	}
}

// readAhead reads the record that goes to dst into a free slot (its
// bytes straight into dst in the integrity mode) and, with more, the
// next record's length, which it returns.
func (c *recordLayer) readAhead(o *openers, dst []byte, more bool) (openJob, []byte, error) {
	i := <-o.free
	ahead := 0
	if more {
		ahead = 4
	}
	src := macTagLen
	if c.sealed {
		src += len(dst)
	} else if err := c.readRest(dst); err != nil {
		o.free <- i
		return openJob{}, nil, err
	}
	c.slots[i] = grow(c.slots[i], src+ahead)
	b := c.slots[i][:src+ahead]
	if err := c.readRest(b); err != nil {
		o.free <- i
		return openJob{}, nil, err
	}
	return openJob{keys: c.recv, seq: c.recvSeq, dst: dst, src: b[:src], slot: i}, b[src:], nil
}
