package ctrdata

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
)

// MissingKey is the key of an empty categorical field of a Criteo line:
// beyond the 32-bit hashed ids, so it is a key of its own in every field.
const MissingKey = math.MaxUint64

// CriteoTestFraction is the share of the lines of a single Criteo file
// held out as the test set: its last lines (the logs are in time order,
// so the test set is the most recent traffic, as in the benchmark).
const CriteoTestFraction = 0.1

// CriteoFile is a Criteo text file, or a range of its lines: one sample
// a line, `label \t I1..I13 \t C1..C26` (tab-separated, 40 fields, any
// field but the label may be empty). A dense count v reads as
// log(1 + max(v, 0)), empty as 0; a categorical id is hexadecimal,
// empty is MissingKey. Streams scan the file from its start.
type CriteoFile struct {
	path     string
	from, to int // its lines [from, to)
}

// OpenCriteo counts the lines of a Criteo file (one pass) and returns
// the file as a Source of all of them.
func OpenCriteo(path string) (*CriteoFile, error) {
	n, err := countLines(path)
	if err != nil {
		return nil, err
	}
	return &CriteoFile{path: path, to: n}, nil
}

// Split returns the first lines of c and the rest, the rest being frac of
// them (at least one line each when c has two).
func (c *CriteoFile) Split(frac float64) (train, test *CriteoFile) {
	n := c.to - c.from
	k := min(max(int(math.Round(float64(n)*frac)), 1), n-1)
	cut := c.to - max(k, 0)
	return &CriteoFile{c.path, c.from, cut}, &CriteoFile{c.path, cut, c.to}
}

func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("ctrdata: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 1<<16)
	n, last := 0, byte('\n')
	for {
		k, err := f.Read(buf)
		n += bytes.Count(buf[:k], []byte{'\n'})
		if k > 0 {
			last = buf[k-1]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("ctrdata: %s: %w", path, err)
		}
	}
	if last != '\n' {
		n++ // a last line without its newline
	}
	return n, nil
}

// Schema implements Source.
func (c *CriteoFile) Schema() Schema { return Criteo }

// Len implements Source.
func (c *CriteoFile) Len() int { return c.to - c.from }

// Open implements Source.
func (c *CriteoFile) Open(lo, hi int) (Stream, error) {
	if err := checkRange(lo, hi, c.Len()); err != nil {
		return nil, err
	}
	f, err := os.Open(c.path)
	if err != nil {
		return nil, fmt.Errorf("ctrdata: %w", err)
	}
	s := &criteoStream{f: f, r: bufio.NewReaderSize(f, 1<<20), path: c.path, hi: c.from + hi}
	for s.line < c.from+lo {
		if _, err := s.readLine(); err != nil {
			f.Close()
			return nil, err
		}
	}
	return s, nil
}

type criteoStream struct {
	f        *os.File
	r        *bufio.Reader
	path     string
	line, hi int // the next line's number, the end of the range
}

// readLine returns the next line without its newline.
func (s *criteoStream) readLine() ([]byte, error) {
	b, err := s.r.ReadSlice('\n')
	for errors.Is(err, bufio.ErrBufferFull) { // a line longer than the buffer
		more, e := s.r.ReadSlice('\n')
		b, err = append(bytes.Clone(b), more...), e
	}
	if err == io.EOF && len(b) > 0 {
		err = nil
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF // the file shrank since it was counted
		}
		return nil, fmt.Errorf("ctrdata: %s: line %d: %w", s.path, s.line+1, err)
	}
	s.line++
	return bytes.TrimRight(b, "\r\n"), nil
}

func (s *criteoStream) Next(b *Batch) error {
	b.N = 0
	if b.Schema != Criteo {
		return fmt.Errorf("ctrdata: batch of %+v for a Criteo file", b.Schema)
	}
	for b.N < b.Cap() && s.line < s.hi {
		line, err := s.readLine()
		if err != nil {
			return err
		}
		if err := parseCriteo(line, b, b.N); err != nil {
			return fmt.Errorf("ctrdata: %s: line %d: %w", s.path, s.line, err)
		}
		b.N++
	}
	if b.N == 0 {
		return io.EOF
	}
	return nil
}

func (s *criteoStream) Close() error { return s.f.Close() }

// parseCriteo reads one line into sample i of b.
func parseCriteo(line []byte, b *Batch, i int) error {
	fields := bytes.Split(line, []byte{'\t'})
	if want := 1 + Criteo.Dense + Criteo.Cat; len(fields) != want {
		return fmt.Errorf("%d tab-separated fields, want %d (label, 13 counts, 26 ids)", len(fields), want)
	}
	switch string(fields[0]) {
	case "0":
		b.Labels[i] = 0
	case "1":
		b.Labels[i] = 1
	default:
		return fmt.Errorf("label %q: want 0 or 1", fields[0])
	}
	dense := b.Dense[i*Criteo.Dense : (i+1)*Criteo.Dense]
	for j, f := range fields[1 : 1+Criteo.Dense] {
		v, err := parseCount(f)
		if err != nil {
			return fmt.Errorf("field I%d: %w", j+1, err)
		}
		dense[j] = v
	}
	keys := b.Keys[i*Criteo.Cat : (i+1)*Criteo.Cat]
	for j, f := range fields[1+Criteo.Dense:] {
		k, err := parseID(f)
		if err != nil {
			return fmt.Errorf("field C%d: %w", j+1, err)
		}
		keys[j] = k
	}
	return nil
}

// parseCount reads a dense count as log(1 + max(v, 0)); empty is 0.
func parseCount(f []byte) (float32, error) {
	if len(f) == 0 {
		return 0, nil
	}
	v, err := strconv.ParseInt(string(f), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("count %q: not an integer", f)
	}
	return float32(math.Log1p(float64(max(v, 0)))), nil
}

// parseID reads a hexadecimal id; empty is MissingKey.
func parseID(f []byte) (uint64, error) {
	if len(f) == 0 {
		return MissingKey, nil
	}
	k, err := strconv.ParseUint(string(f), 16, 64)
	if err != nil || k == MissingKey {
		return 0, fmt.Errorf("id %q: not a hexadecimal id", f)
	}
	return k, nil
}
