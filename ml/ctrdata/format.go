package ctrdata

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// The binary format (docs/models.md, "The file format"): a 32-byte
// header, then fixed-size records, all little-endian.
//
//	header: "pstrctr1" | uint32 dense | uint32 cat | uint64 samples | uint64 0
//	record: uint8 label | float32 dense[dense] | uint32 key[cat]
//
// Dense values are stored as a trainer reads them (already transformed);
// keys are 32-bit, as Criteo's hashed ids are. Sample i starts at byte
// 32 + i*RecordSize, so a range of samples is one positioned read.
const (
	magic      = "pstrctr1"
	headerSize = 32
)

// ErrFormat is wrapped by the errors of a file that is not in the format.
var ErrFormat = errors.New("ctrdata: not a CTR data file")

// RecordSize is the bytes of one sample of schema s.
func RecordSize(s Schema) int { return 1 + 4*s.Dense + 4*s.Cat }

// Writer writes a file of a known number of samples.
type Writer struct {
	f      *os.File
	w      *bufio.Writer
	path   string
	schema Schema
	n, got int
	rec    []byte
}

// Create starts writing path (atomically: into path.tmp, renamed by
// Close) for n samples of schema s.
func Create(path string, s Schema, n int) (*Writer, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return nil, fmt.Errorf("ctrdata: %w", err)
	}
	w := &Writer{f: f, w: bufio.NewWriterSize(f, 1<<20), path: path, schema: s, n: n, rec: make([]byte, RecordSize(s))}
	var h [headerSize]byte
	copy(h[:], magic)
	binary.LittleEndian.PutUint32(h[8:], uint32(s.Dense))
	binary.LittleEndian.PutUint32(h[12:], uint32(s.Cat))
	binary.LittleEndian.PutUint64(h[16:], uint64(n))
	if _, err := w.w.Write(h[:]); err != nil {
		f.Close()
		return nil, fmt.Errorf("ctrdata: %w", err)
	}
	return w, nil
}

// Write appends one sample: its label, len(dense) == Dense values and
// len(keys) == Cat keys, each below 2^32.
func (w *Writer) Write(label uint8, dense []float32, keys []uint64) error {
	s := w.schema
	if len(dense) != s.Dense || len(keys) != s.Cat || label > 1 {
		return fmt.Errorf("ctrdata: sample of label %d, %d dense values and %d keys for %d and %d fields", label, len(dense), len(keys), s.Dense, s.Cat)
	}
	if w.got == w.n {
		return fmt.Errorf("ctrdata: more than the %d samples announced", w.n)
	}
	r := w.rec
	r[0] = label
	o := 1
	for _, v := range dense {
		binary.LittleEndian.PutUint32(r[o:], math.Float32bits(v))
		o += 4
	}
	for _, k := range keys {
		if k > math.MaxUint32 {
			return fmt.Errorf("ctrdata: key %d does not fit the format's 32 bits", k)
		}
		binary.LittleEndian.PutUint32(r[o:], uint32(k))
		o += 4
	}
	w.got++
	if _, err := w.w.Write(r); err != nil {
		return fmt.Errorf("ctrdata: %w", err)
	}
	return nil
}

// Close finishes the file: it checks every announced sample was written,
// syncs and renames it into place.
func (w *Writer) Close() error {
	err := w.w.Flush()
	if err == nil && w.got != w.n {
		err = fmt.Errorf("ctrdata: %d samples written of the %d announced", w.got, w.n)
	}
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.path+".tmp", w.path)
	} else {
		os.Remove(w.path + ".tmp")
	}
	if err != nil {
		return fmt.Errorf("ctrdata: writing %s: %w", filepath.Base(w.path), err)
	}
	return nil
}

// File is an open data file: a Source whose streams read it with
// positioned reads (safe to use from many goroutines).
type File struct {
	f      *os.File
	schema Schema
	n      int
}

// OpenFile opens a data file and checks its header and size.
func OpenFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("ctrdata: %w", err)
	}
	d, err := readHeader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

func readHeader(f *os.File) (*File, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return nil, fmt.Errorf("short header: %w", ErrFormat)
	}
	if string(h[:8]) != magic {
		return nil, fmt.Errorf("magic %q: %w", h[:8], ErrFormat)
	}
	s := Schema{Dense: int(binary.LittleEndian.Uint32(h[8:])), Cat: int(binary.LittleEndian.Uint32(h[12:]))}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrFormat)
	}
	n := binary.LittleEndian.Uint64(h[16:])
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	rec := uint64(RecordSize(s))
	if n > uint64(math.MaxInt32)*64 || uint64(st.Size()) != headerSize+n*rec {
		return nil, fmt.Errorf("%d bytes for %d samples of %d bytes: %w", st.Size(), n, rec, ErrFormat)
	}
	return &File{f: f, schema: s, n: int(n)}, nil
}

// Schema implements Source.
func (d *File) Schema() Schema { return d.schema }

// Len implements Source.
func (d *File) Len() int { return d.n }

// Close closes the file.
func (d *File) Close() error { return d.f.Close() }

// Open implements Source.
func (d *File) Open(lo, hi int) (Stream, error) {
	if err := checkRange(lo, hi, d.n); err != nil {
		return nil, err
	}
	return &fileStream{d: d, next: lo, hi: hi}, nil
}

// fileStream reads a range of a File a batch at a time, one positioned
// read per batch.
type fileStream struct {
	d        *File
	next, hi int
	buf      []byte
}

func (s *fileStream) Next(b *Batch) error {
	b.N = 0
	if s.next >= s.hi {
		return io.EOF
	}
	if b.Schema != s.d.schema {
		return fmt.Errorf("ctrdata: batch of %+v for a file of %+v", b.Schema, s.d.schema)
	}
	n := min(b.Cap(), s.hi-s.next)
	rec := RecordSize(s.d.schema)
	if cap(s.buf) < n*rec {
		s.buf = make([]byte, n*rec)
	}
	buf := s.buf[:n*rec]
	if _, err := s.d.f.ReadAt(buf, headerSize+int64(s.next)*int64(rec)); err != nil {
		return fmt.Errorf("ctrdata: reading samples from %d: %w", s.next, err)
	}
	if err := decode(buf, b, n); err != nil {
		return fmt.Errorf("ctrdata: sample %d and on: %w", s.next, err)
	}
	s.next += n
	return nil
}

// decode fills b with the n records of buf.
func decode(buf []byte, b *Batch, n int) error {
	sd, sc := b.Schema.Dense, b.Schema.Cat
	rec := RecordSize(b.Schema)
	for i := range n {
		r := buf[i*rec : (i+1)*rec]
		if r[0] > 1 {
			return fmt.Errorf("label %d: %w", r[0], ErrFormat)
		}
		b.Labels[i] = r[0]
		o := 1
		dense := b.Dense[i*sd : (i+1)*sd]
		for j := range dense {
			dense[j] = math.Float32frombits(binary.LittleEndian.Uint32(r[o:]))
			o += 4
		}
		keys := b.Keys[i*sc : (i+1)*sc]
		for j := range keys {
			keys[j] = uint64(binary.LittleEndian.Uint32(r[o:]))
			o += 4
		}
	}
	b.N = n
	return nil
}

func (s *fileStream) Close() error { return nil }
