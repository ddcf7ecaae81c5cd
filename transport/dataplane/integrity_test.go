package dataplane

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	pb "github.com/pstrain/pstrain/proto"
)

// integrityServer serves e in the integrity-only mode (or full TLS with
// integrity false) on a loopback address named "localhost" (no
// same-host socket), returning the address.
func integrityServer(t testing.TB, ca testCA, e Backend, integrity bool) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stls, _ := ca.configs(t, "ps-0")
	s := NewServer(e, lis, Config{MaxPayload: 8 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), TLS: WithPrivacy(stls, integrity)})
	if tt, ok := t.(*testing.T); ok {
		serveTest(tt, s)
	} else {
		go s.Serve()
		t.Cleanup(func() { s.Close() })
	}
	return strings.Replace(lis.Addr().String(), "127.0.0.1", "localhost", 1)
}

func clientOf(addr string, cfg *tls.Config) *Client {
	return NewClient(func(context.Context) (string, error) { return addr, nil }, cfg, 8<<20)
}

// In both modes, frames of every size arrive whole and in order both
// ways, over records: sealed (encrypt) or tagged in the clear
// (integrity).
func TestRecordsRoundTrip(t *testing.T) {
	for _, integrity := range []bool{false, true} {
		ca := newTestCA(t)
		addr := integrityServer(t, ca, &echoBackend{}, integrity)
		_, ctls := ca.configs(t, "worker-0")
		c := clientOf(addr, WithPrivacy(ctls, integrity))
		echoRoundTrips(t, c, 3*maxRecord+12345, 10, 0, maxRecord, sealRecord, sealRecord+1, parallelSeal-1, 1<<20)
		c.mu.Lock()
		mc, ok := c.conn.(*recordLayer)
		c.mu.Unlock()
		c.Close()
		if !ok {
			t.Fatalf("integrity %t: the connection is %T, want records", integrity, c.conn)
		}
		if mc.sealed == integrity || mc.sendSeq == 0 || mc.recvSeq == 0 {
			t.Fatalf("integrity %t: sealed %t, records sent %d, received %d: want the mode's, both ways", integrity, mc.sealed, mc.sendSeq, mc.recvSeq)
		}
	}
}

// flipProxy forwards connections to addr, flipping one byte of the
// client's stream in the first read of more than 64 KiB (a push's
// payload, never the handshake).
func flipProxy(t *testing.T, addr string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", strings.Replace(addr, "localhost", "127.0.0.1", 1))
			if err != nil {
				in.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(in, out); in.Close() }()
			go func() { defer wg.Done(); copyFlipping(out, in); out.Close() }()
		}
	}()
	return strings.Replace(lis.Addr().String(), "127.0.0.1", "localhost", 1)
}

func copyFlipping(dst io.Writer, src io.Reader) {
	buf := make([]byte, 256<<10)
	flipped := false
	for {
		n, err := src.Read(buf)
		if n > 64<<10 && !flipped {
			buf[n/2] ^= 0x10
			flipped = true
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A byte changed on the wire is caught in both modes: the push is
// refused with the reason and never reaches the backend.
func TestRecordsRefuseTamperedFrame(t *testing.T) {
	for _, integrity := range []bool{false, true} {
		ca := newTestCA(t)
		e := &echoBackend{}
		addr := flipProxy(t, integrityServer(t, ca, e, integrity))
		_, ctls := ca.configs(t, "worker-0")
		c := clientOf(addr, WithPrivacy(ctls, integrity))
		grad := make([]byte, 1<<20)
		_, err := c.Push(context.Background(), &pb.PushRequest{Grad: grad, RunId: "r"})
		c.Close()
		if err == nil || !strings.Contains(err.Error(), "MAC does not verify") {
			t.Fatalf("integrity %t: a tampered push: %v, want refused for its MAC", integrity, err)
		}
		if n := e.count(); n != 0 {
			t.Fatalf("integrity %t: the backend saw %d pushes, want none", integrity, n)
		}
	}
}

// A client without a certificate is refused, whatever its mode.
func TestIntegrityRefusesClientWithoutCertificate(t *testing.T) {
	ca := newTestCA(t)
	e := &echoBackend{}
	addr := integrityServer(t, ca, e, true)
	_, ctls := ca.configs(t, "worker-0")
	ctls.Certificates = nil
	c := clientOf(addr, WithPrivacy(ctls, true))
	defer c.Close()
	if _, err := c.Push(context.Background(), &pb.PushRequest{Grad: make([]byte, 100), RunId: "r"}); err == nil {
		t.Fatal("a client without a certificate pushed")
	}
	if n := e.count(); n != 0 {
		t.Fatalf("the backend saw %d pushes, want none", n)
	}
}

// Ends that run different modes fail at the handshake, and say why.
func TestIntegrityModeMismatch(t *testing.T) {
	ca := newTestCA(t)
	_, ctls := ca.configs(t, "worker-0")
	for _, serverIntegrity := range []bool{true, false} {
		addr := integrityServer(t, ca, &echoBackend{}, serverIntegrity)
		c := clientOf(addr, WithPrivacy(ctls, !serverIntegrity))
		_, err := c.Pull(context.Background(), &pb.PullRequest{RunId: "r"})
		c.Close()
		if err == nil || !strings.Contains(err.Error(), "different --data-plane-privacy") {
			t.Errorf("server integrity %t, client not: %v, want a mode mismatch", serverIntegrity, err)
		}
	}
}

// macPair is a writer's and a reader's ends of one direction of a
// connection keyed with key, sealed (encrypt mode) or tagged, the
// writer's records going into wire.
func macPair(t testing.TB, key byte, wire *bytes.Buffer, sealed bool) (w, r *recordLayer) {
	t.Helper()
	n := macKeyLen
	if sealed {
		n = sealKeyLen
	}
	k := bytes.Repeat([]byte{key}, n)
	w, err := newRecordLayer(recordKeys{sealed: sealed, send: k, recv: k}, wire, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err = newRecordLayer(recordKeys{sealed: sealed, send: k, recv: k}, nil, wire)
	if err != nil {
		t.Fatal(err)
	}
	return w, r
}

// records writes each of msgs as one write with w and returns each
// write's wire bytes.
func records(t testing.TB, w *recordLayer, wire *bytes.Buffer, msgs ...string) [][]byte {
	var out [][]byte
	for _, m := range msgs {
		if _, err := w.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
		out = append(out, bytes.Clone(wire.Bytes()))
		wire.Reset()
	}
	return out
}

// readAll reads r's records from wire until an error.
func readAll(r *recordLayer, wire *bytes.Buffer, recs ...[]byte) (string, error) {
	wire.Reset()
	for _, b := range recs {
		wire.Write(b)
	}
	got, err := io.ReadAll(r)
	return string(got), err
}

// In both modes, a record replayed, reordered, dropped, cut short or
// taken from another connection (other keys) or the other direction
// fails, and none of its bytes, nor any later record's, are delivered.
func TestRecordsRefuseReplayReorderTruncationAndOtherConnections(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		var wire bytes.Buffer
		w, _ := macPair(t, 1, &wire, sealed)
		recs := records(t, w, &wire, "first", "second")
		ow, _ := macPair(t, 2, &wire, sealed)
		other := records(t, ow, &wire, "first")
		for name, seq := range map[string][][]byte{
			"replayed":           {recs[0], recs[0]},
			"reordered":          {recs[1], recs[0]},
			"dropped":            {recs[1]},
			"another connection": {other[0]},
		} {
			_, r := macPair(t, 1, &wire, sealed)
			got, err := readAll(r, &wire, seq...)
			if !errors.Is(err, errBadMAC) || !errors.Is(err, ErrBadFrame) {
				t.Errorf("sealed %t, %s: read %q, %v; want a bad MAC", sealed, name, got, err)
			}
			if strings.Contains(got, "second") || (name != "replayed" && got != "") {
				t.Errorf("sealed %t, %s: %q delivered", sealed, name, got)
			}
		}
		_, r := macPair(t, 1, &wire, sealed)
		if got, err := readAll(r, &wire, recs[0][:len(recs[0])-1]); err != io.ErrUnexpectedEOF || got != "" {
			t.Errorf("sealed %t, cut short: %q, %v; want nothing and an unexpected end", sealed, got, err)
		}
		_, r = macPair(t, 1, &wire, sealed)
		if got, err := readAll(r, &wire, recs...); err != nil || got != "firstsecond" {
			t.Fatalf("sealed %t, in order: %q, %v", sealed, got, err)
		}
	}
}

// The encrypt mode's records hide their bytes, large writes (sealed by
// two goroutines) as small; they read back whole, cut at any read size.
func TestSealedRecordsAreSecretAndWhole(t *testing.T) {
	var wire bytes.Buffer
	w, r := macPair(t, 5, &wire, true)
	msg := bytes.Repeat([]byte("gradient"), (3*parallelSeal+77)/8)
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(wire.Bytes(), []byte("gradientgradient")) {
		t.Fatal("the plaintext is on the wire")
	}
	want := (len(msg) + sealRecord - 1) / sealRecord
	if w.sendSeq != uint64(want) {
		t.Fatalf("%d records, want %d", w.sendSeq, want)
	}
	got := make([]byte, 0, len(msg))
	buf := make([]byte, sealRecord+3) // some records fit with their tag, some not
	for len(got) < len(msg) {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("the records read back differ")
	}
}

// TestRecordsLeaveNoUnverifiedBytes: a record cut short, or whose tag
// fails, leaves none of its bytes in the reader's buffer, in either mode
// (a pull reads straight into the model's parameters).
func TestRecordsLeaveNoUnverifiedBytes(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		var wire bytes.Buffer
		_, r := macPair(t, 6, &wire, sealed)
		cut := append([]byte{0, 4, 0, 0}, bytes.Repeat([]byte("EVIL"), 100)...) // 1024 bytes claimed, 400 sent
		wire.Write(cut)
		p := make([]byte, 4096)
		if n, err := r.Read(p); err == nil || n != 0 {
			t.Fatalf("sealed %v: a cut record read %d bytes, %v", sealed, n, err)
		}
		if bytes.Contains(p, []byte("EVIL")) {
			t.Errorf("sealed %v: a cut record's bytes were left in the buffer", sealed)
		}
		w, r2 := macPair(t, 6, &wire, sealed)
		recs := records(t, w, &wire, strings.Repeat("GOOD", 100))
		recs[0][len(recs[0])-1] ^= 1 // the tag
		wire.Reset()
		wire.Write(recs[0])
		clear(p)
		if n, err := r2.Read(p); err == nil || n != 0 {
			t.Fatalf("sealed %v: a record with a bad tag read %d bytes, %v", sealed, n, err)
		}
		if bytes.Contains(p, []byte("GOOD")) || !sealed && bytes.Count(p, []byte{0}) != len(p) {
			t.Errorf("sealed %v: a record that failed its tag left bytes in the buffer", sealed)
		}
	}
}

// TestSealedParallelWritesChangeKeysInStep: key changes that fall inside
// a write sealed by two goroutines, and across the chunks of a write
// larger than sealChunk, seal every record under the key of its
// sequence number: a reader changing keys at the same records opens
// them all, and one changing keys elsewhere fails.
func TestSealedParallelWritesChangeKeysInStep(t *testing.T) {
	var wire bytes.Buffer
	w, r := macPair(t, 9, &wire, true)
	w.rekey, r.rekey = 3, 3
	msg := make([]byte, sealChunk+5*sealRecord+123) // 22 records in two chunks, both sealed in parallel
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	if want := uint64((len(msg) + sealRecord - 1) / sealRecord); w.sendSeq != want {
		t.Fatalf("%d records, want %d", w.sendSeq, want)
	}
	sent := bytes.Clone(wire.Bytes())
	got, err := io.ReadAll(io.LimitReader(r, int64(len(msg))))
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(msg))
	}
	_, other := macPair(t, 9, &wire, true)
	other.rekey = 4
	wire.Reset()
	wire.Write(sent)
	if _, err := io.ReadAll(io.LimitReader(other, int64(len(msg)))); !errors.Is(err, errBadMAC) {
		t.Fatalf("a reader changing keys every 4 records: %v, want a bad MAC", err)
	}
}

// TestSealedWriteBufferIsBounded: whatever a write's size, the write
// buffer a connection keeps holds one chunk's records.
func TestSealedWriteBufferIsBounded(t *testing.T) {
	var wire bytes.Buffer
	w, r := macPair(t, 8, &wire, true)
	msg := bytes.Repeat([]byte{1, 2, 3}, 2<<20) // 6 MiB
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	chunk := sealChunk + (sealChunk/sealRecord+1)*(4+macTagLen)
	if cap(w.wbuf) > chunk {
		t.Errorf("the write buffer kept %d bytes after a %d-byte write, want at most %d", cap(w.wbuf), len(msg), chunk)
	}
	got, err := io.ReadAll(io.LimitReader(r, int64(len(msg))))
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(msg))
	}
}

// FuzzMACRecord: in either mode, whatever is changed in a record's
// bytes on the wire, the reader delivers the original bytes or none,
// never others.
func FuzzMACRecord(f *testing.F) {
	f.Add([]byte("a gradient"), uint16(0), byte(1), false)
	f.Add([]byte("x"), uint16(4), byte(0x80), true)
	f.Add(bytes.Repeat([]byte{7}, 300), uint16(200), byte(3), true)
	f.Fuzz(func(t *testing.T, msg []byte, at uint16, flip byte, sealed bool) {
		if len(msg) == 0 || flip == 0 {
			return
		}
		var wire bytes.Buffer
		w, r := macPair(t, 3, &wire, sealed)
		recs := records(t, w, &wire, string(msg))
		b := recs[0]
		b[int(at)%len(b)] ^= flip
		got, err := readAll(r, &wire, b)
		if err == nil || len(got) != 0 {
			t.Fatalf("a changed record read as %q, %v", got, err)
		}
	})
}

// FuzzRecordReader: any bytes at all, read as records in either mode,
// give an error and no bytes (nobody without the key makes a record
// that verifies), never a panic or a read past a record's length.
func FuzzRecordReader(f *testing.F) {
	f.Add([]byte{5, 0, 0, 0, 'h', 'e', 'l', 'l', 'o'}, false)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, true)
	f.Add([]byte{1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, true)
	f.Fuzz(func(t *testing.T, b []byte, sealed bool) {
		var wire bytes.Buffer
		_, r := macPair(t, 4, &wire, sealed)
		got, err := readAll(r, &wire, b)
		if len(b) > 0 && (err == nil || got != "") {
			t.Fatalf("%d arbitrary bytes read as %q, %v", len(b), got, err)
		}
	})
}

// BenchmarkTag compares the candidate tags over a record: GMAC (AES-GCM
// sealing nothing) and HMAC-SHA256; and, for scale, AES-GCM encrypting
// the record as TLS does.
func BenchmarkTag(b *testing.B) {
	rec := make([]byte, maxRecord)
	b.Run("gmac", func(b *testing.B) {
		g, _ := newGCM(make([]byte, macKeyLen))
		tag := make([]byte, 0, macTagLen)
		var n [12]byte
		b.SetBytes(int64(len(rec)))
		for i := range b.N {
			g.Seal(tag[:0], nonce(&n, uint64(i)), nil, rec)
		}
	})
	b.Run("aes128-gcm-encrypt", func(b *testing.B) {
		g, _ := newGCM(make([]byte, sealKeyLen))
		out := make([]byte, 0, len(rec)+macTagLen)
		var n [12]byte
		b.SetBytes(int64(len(rec)))
		for i := range b.N {
			g.Seal(out[:0], nonce(&n, uint64(i)), rec, nil)
		}
	})
	b.Run("aes256-gcm-encrypt", func(b *testing.B) {
		g, _ := newGCM(make([]byte, macKeyLen))
		out := make([]byte, 0, len(rec)+macTagLen)
		var n [12]byte
		b.SetBytes(int64(len(rec)))
		for i := range b.N {
			g.Seal(out[:0], nonce(&n, uint64(i)), rec, nil)
		}
	})
	b.Run("hmac-sha256", func(b *testing.B) {
		h := hmac.New(sha256.New, make([]byte, 32))
		var sum [32]byte
		b.SetBytes(int64(len(rec)))
		for range b.N {
			h.Reset()
			h.Write(rec)
			h.Sum(sum[:0])
		}
	})
}

// Every rekey records the key moves on, at the same record on both
// ends: records across the change read back, the key is no longer the
// first, and a reader that changes keys elsewhere fails.
func TestRecordsChangeKeys(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		var wire bytes.Buffer
		w, r := macPair(t, 6, &wire, sealed)
		first := bytes.Clone(w.sendKey)
		w.rekey, r.rekey = 2, 2
		msgs := []string{"a", "bb", "ccc", "dddd", "eeeee"}
		recs := records(t, w, &wire, msgs...)
		if bytes.Equal(w.sendKey, first) {
			t.Fatalf("sealed %t: the key did not change over %d records", sealed, w.sendSeq)
		}
		if got, err := readAll(r, &wire, recs...); err != nil || got != strings.Join(msgs, "") {
			t.Fatalf("sealed %t: across key changes: %q, %v", sealed, got, err)
		}
		_, other := macPair(t, 6, &wire, sealed)
		other.rekey = 3
		if got, err := readAll(other, &wire, recs...); !errors.Is(err, errBadMAC) || got != "abb" {
			t.Fatalf("sealed %t: a reader changing keys elsewhere: %q, %v; want the first key's records, then a bad MAC", sealed, got, err)
		}
	}
}
