package dataplane

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// pattern is n bytes that differ from record to record and from zero.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251 + 1)
	}
	return b
}

// fullReadSizes are full reads that cover writes of every record size
// in both modes: records that end inside a read, a read smaller than a
// record, and reads large enough for the openers.
func fullReadSizes(sealed bool) (writes, reads []int) {
	rec := maxRecord
	if sealed {
		rec = sealRecord
	}
	writes = []int{5, 9*rec + 123, 2*rec + 1, parallelOpen}
	reads = []int{5, 3*rec + 17, 223, 6*rec - 117, 2*rec + 1, parallelOpen} // as many bytes
	return writes, reads
}

// In both modes, full reads give back what was written, across key
// changes, whether their ends fall on records' ends or inside records,
// and they leave the records beyond them to the next read.
func TestFullReadsReadBack(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		var wire bytes.Buffer
		w, r := macPair(t, 7, &wire, sealed)
		w.rekey, r.rekey = 3, 3
		writes, reads := fullReadSizes(sealed)
		var msg []byte
		for _, n := range writes {
			b := pattern(n)
			b[0] = byte(len(msg))
			if _, err := w.Write(b); err != nil {
				t.Fatal(err)
			}
			msg = append(msg, b...)
		}
		var got []byte
		for _, n := range reads {
			p := make([]byte, n)
			if err := r.readFull(p); err != nil {
				t.Fatalf("sealed %t: a full read of %d bytes after %d: %v", sealed, n, len(got), err)
			}
			got = append(got, p...)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("sealed %t: %d bytes read back differ from the %d written", sealed, len(got), len(msg))
		}
		if r.recvSeq != w.sendSeq || wire.Len() != 0 {
			t.Fatalf("sealed %t: %d records opened of %d, %d bytes left", sealed, r.recvSeq, w.sendSeq, wire.Len())
		}
	}
}

// fullReadRecords writes n records of size bytes each (one write) and
// returns the wire bytes and where each record starts on the wire.
func fullReadRecords(t *testing.T, sealed bool, n, size int) ([]byte, []int) {
	t.Helper()
	var wire bytes.Buffer
	w, _ := macPair(t, 11, &wire, sealed)
	for range n {
		if _, err := w.Write(pattern(size)); err != nil {
			t.Fatal(err)
		}
	}
	at := make([]int, n)
	for i := range at {
		at[i] = i * (4 + size + macTagLen)
	}
	return bytes.Clone(wire.Bytes()), at
}

// TestFullReadRefusesEveryTamperedRecord: a full read whose records go
// to both openers (record k to opener k%2) fails when any one record's
// bytes or tag were changed, whichever opener had it, and leaves the
// whole buffer cleared, the records that verified included; the
// connection is then done.
func TestFullReadRefusesEveryTamperedRecord(t *testing.T) {
	const n, size = 6, sealRecord
	for _, sealed := range []bool{false, true} {
		sent, at := fullReadRecords(t, sealed, n, size)
		for k := range n {
			for _, off := range []int{4 + size/2, 4 + size + macTagLen - 1} { // its bytes, its tag
				b := bytes.Clone(sent)
				b[at[k]+off] ^= 0x20
				var wire bytes.Buffer
				_, r := macPair(t, 11, &wire, sealed)
				wire.Write(b)
				p := bytes.Repeat([]byte{0xaa}, n*size)
				err := r.readFull(p)
				if !errors.Is(err, errBadMAC) || !errors.Is(err, ErrBadFrame) {
					t.Fatalf("sealed %t, record %d changed at %d: %v, want a bad MAC", sealed, k, off, err)
				}
				if i := bytes.IndexFunc(p, func(r rune) bool { return r != 0 }); i >= 0 {
					t.Fatalf("sealed %t, record %d changed at %d: byte %d of the buffer left set", sealed, k, off, i)
				}
				if _, err := r.Read(make([]byte, 10)); err == nil {
					t.Fatalf("sealed %t, record %d changed: the connection read on", sealed, k)
				}
			}
		}
	}
}

// A stream cut inside a full read, at a record's end or inside one, is
// an unexpected end, and the buffer is cleared.
func TestFullReadCutStreamClears(t *testing.T) {
	const n, size = 4, sealRecord
	for _, sealed := range []bool{false, true} {
		sent, at := fullReadRecords(t, sealed, n, size)
		for _, cut := range []int{at[2], at[2] + 2, at[3] - 1, len(sent) - 1} {
			var wire bytes.Buffer
			_, r := macPair(t, 11, &wire, sealed)
			wire.Write(sent[:cut])
			p := bytes.Repeat([]byte{0xaa}, n*size)
			if err := r.readFull(p); err != io.ErrUnexpectedEOF {
				t.Fatalf("sealed %t, cut at %d of %d: %v, want an unexpected end", sealed, cut, len(sent), err)
			}
			if bytes.Count(p, []byte{0}) != len(p) {
				t.Fatalf("sealed %t, cut at %d: the buffer was not cleared", sealed, cut)
			}
		}
		var wire bytes.Buffer
		_, r := macPair(t, 11, &wire, sealed)
		if err := r.readFull(make([]byte, parallelOpen)); err != io.EOF {
			t.Fatalf("sealed %t: a full read of an empty stream: %v, want the end", sealed, err)
		}
	}
}

// A record whose length is out of bounds inside a full read ends the
// connection.
func TestFullReadRefusesBadLength(t *testing.T) {
	sent, at := fullReadRecords(t, true, 3, sealRecord)
	copy(sent[at[1]:], []byte{0xff, 0xff, 0xff, 0xff})
	var wire bytes.Buffer
	_, r := macPair(t, 11, &wire, true)
	wire.Write(sent)
	p := make([]byte, 3*sealRecord)
	if err := r.readFull(p); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("a bad length: %v, want a bad frame", err)
	}
	if bytes.Count(p, []byte{0}) != len(p) {
		t.Fatal("the buffer was not cleared")
	}
}

// A key a direction moved on from is zeroed, on both ends; the keys
// the layer was made with are its own copies, left as they were.
func TestRecordsZeroOldKeys(t *testing.T) {
	var wire bytes.Buffer
	k := bytes.Repeat([]byte{3}, sealKeyLen)
	w, err := newRecordLayer(recordKeys{sealed: true, send: k, recv: k}, &wire, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRecordLayer(recordKeys{sealed: true, send: k, recv: k}, nil, &wire)
	if err != nil {
		t.Fatal(err)
	}
	w.rekey, r.rekey = 2, 2
	oldSend, oldRecv := w.sendKey, r.recvKey
	for _, m := range []string{"a", "b", "c"} { // the third under the next key
		if _, err := w.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := io.ReadAll(io.LimitReader(r, 3)); err != nil || string(got) != "abc" {
		t.Fatalf("read %q, %v", got, err)
	}
	if bytes.Count(oldSend, []byte{0}) != sealKeyLen || bytes.Count(oldRecv, []byte{0}) != sealKeyLen {
		t.Fatalf("the first keys were not zeroed: %x, %x", oldSend, oldRecv)
	}
	if bytes.Equal(w.sendKey, oldSend) || !bytes.Equal(w.sendKey, r.recvKey) {
		t.Fatal("the two ends did not move on to the same next key")
	}
	if !bytes.Equal(k, bytes.Repeat([]byte{3}, sealKeyLen)) {
		t.Fatal("the caller's key was changed")
	}
}
