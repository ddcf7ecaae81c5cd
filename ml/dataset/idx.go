package dataset

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
)

// ErrCorrupt is wrapped by every error caused by malformed input: a bad IDX
// header, a file whose length does not match its header, an unusable gzip
// stream, or image and label files that do not belong together. Test for it
// with errors.Is.
var ErrCorrupt = errors.New("corrupt or invalid data file")

// IDX type codes and ranks understood by this package.
const (
	// IDXTypeUint8 is the IDX element-type byte for unsigned bytes, the only
	// element type accepted.
	IDXTypeUint8 = 0x08

	// MagicImages is the magic number of a uint8 rank-3 IDX file
	// ([N, rows, cols] images), e.g. train-images-idx3-ubyte.
	MagicImages = 0x00000803
	// MagicLabels is the magic number of a uint8 rank-1 IDX file ([N]
	// labels), e.g. train-labels-idx1-ubyte.
	MagicLabels = 0x00000801
)

// maxIDXBytes bounds the element count declared by an IDX header. The bound
// only protects the size arithmetic against overflow: memory is never
// allocated for more than the input actually supplies.
const maxIDXBytes = 1 << 40

// gzipID1 and gzipID2 are the first two bytes of every gzip stream. An IDX
// file always starts with two zero bytes, so the two cannot be confused.
const (
	gzipID1 = 0x1f
	gzipID2 = 0x8b
)

// IDX is a decoded uint8 IDX file.
type IDX struct {
	// Dims are the dimensions from the header: [N] for labels, [N, rows,
	// cols] for images.
	Dims []int
	// Data holds the product of Dims bytes in row-major order.
	Data []byte
}

// ParseIDX decodes an uncompressed uint8 IDX file held entirely in b (magic
// 0x00000801 for labels or 0x00000803 for images). The returned Data aliases
// b. len(b) must be exactly the header length plus the product of the
// dimensions; otherwise the error wraps ErrCorrupt.
func ParseIDX(b []byte) (*IDX, error) {
	dims, hdrLen, body, err := parseIDXHeader(b)
	if err != nil {
		return nil, err
	}
	if got := int64(len(b) - hdrLen); got != body {
		return nil, sizeMismatch(dims, body, got)
	}
	return &IDX{Dims: dims, Data: b[hdrLen:len(b):len(b)]}, nil
}

// ReadIDX reads a uint8 IDX file (magic 0x00000801 or 0x00000803) from r,
// which must be positioned at the start of the file and supply the whole
// file, nothing more. A gzip-compressed file is recognised by its magic bytes
// and decompressed transparently. Memory is allocated only as data actually
// arrives, so a header that claims a huge size cannot cause a huge
// allocation. Errors caused by bad input wrap ErrCorrupt; errors from r itself
// are returned wrapped as they are.
func ReadIDX(r io.Reader) (*IDX, error) {
	return readIDX(r, -1)
}

// ReadIDXFile reads the IDX file at path, which may be gzip-compressed. For an
// uncompressed file the declared size is checked against the file size before
// anything is allocated, and the body is read with a single read.
func ReadIDXFile(path string) (*IDX, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	size := int64(-1)
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		size = st.Size()
	}
	idx, err := readIDX(f, size)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", path, err)
	}
	return idx, nil
}

// readIDX implements ReadIDX. size is the total length of r when known
// (a regular file) and -1 otherwise; it is ignored for gzip input.
func readIDX(r io.Reader, size int64) (*IDX, error) {
	br := bufio.NewReader(r)
	var src io.Reader = br
	gz, err := isGzip(br)
	if err != nil {
		return nil, err
	}
	if gz {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, classifyGzip(err)
		}
		defer zr.Close()
		src, size = zr, -1
	}

	dims, hdrLen, body, err := readIDXHeader(src, gz)
	if err != nil {
		return nil, err
	}

	var data []byte
	if size >= 0 {
		// Uncompressed input of known length: check before allocating, then
		// fill the buffer with one read.
		if got := size - int64(hdrLen); got != body {
			return nil, sizeMismatch(dims, body, got)
		}
		data = make([]byte, body)
		if _, err := io.ReadFull(src, data); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("idx: file shrank while reading: %w", ErrCorrupt)
			}
			return nil, err
		}
	} else {
		data, err = readAtMost(src, body)
		if err != nil {
			return nil, maybeGzip(err, gz)
		}
		if int64(len(data)) < body {
			return nil, sizeMismatch(dims, body, int64(len(data)))
		}
	}
	// Anything after the body is an error (for gzip this also reaches the
	// end of the stream, which verifies its CRC).
	var one [1]byte
	n, err := io.ReadFull(src, one[:])
	if n > 0 {
		return nil, fmt.Errorf("idx: trailing bytes after the %d-byte body declared by dims %v: %w", body, dims, ErrCorrupt)
	}
	if err != nil && err != io.EOF {
		return nil, maybeGzip(err, gz)
	}
	return &IDX{Dims: dims, Data: data}, nil
}

// readIDXHeader reads and validates the header at the start of r (gz: r
// is a gzip stream's content) and returns what parseIDXHeader returns.
func readIDXHeader(r io.Reader, gz bool) (dims []int, hdrLen int, body int64, err error) {
	// Fixed part of the header, then the dimensions.
	var hdr [4 + 4*3]byte
	if err := readHeaderPart(r, hdr[:4], gz); err != nil {
		return nil, 0, 0, err
	}
	if err := checkIDXPrefix(hdr[:4]); err != nil {
		return nil, 0, 0, err
	}
	hdrLen = 4 + 4*int(hdr[3])
	if err := readHeaderPart(r, hdr[4:hdrLen], gz); err != nil {
		return nil, 0, 0, err
	}
	return parseIDXHeader(hdr[:hdrLen])
}

func errShortHeader() error {
	return fmt.Errorf("idx: truncated header: %w", ErrCorrupt)
}

// checkIDXPrefix validates the 4-byte magic number at the start of an IDX
// file: two zero bytes, the element type and the rank.
func checkIDXPrefix(b []byte) error {
	if b[0] != 0 || b[1] != 0 {
		return fmt.Errorf("idx: bad magic 0x%08x (want 0x00000801 or 0x00000803): %w", binary.BigEndian.Uint32(b), ErrCorrupt)
	}
	if b[2] != IDXTypeUint8 {
		return fmt.Errorf("idx: element type 0x%02x is not unsigned byte (0x08): %w", b[2], ErrCorrupt)
	}
	if rank := b[3]; rank != 1 && rank != 3 {
		return fmt.Errorf("idx: unsupported rank %d (want 1 for labels or 3 for images): %w", rank, ErrCorrupt)
	}
	return nil
}

// parseIDXHeader validates the header at the start of b. It returns the
// dimensions, the header length and the body length the header declares.
// It does not look at anything after the header.
func parseIDXHeader(b []byte) (dims []int, hdrLen int, body int64, err error) {
	if len(b) < 4 {
		return nil, 0, 0, errShortHeader()
	}
	if err := checkIDXPrefix(b); err != nil {
		return nil, 0, 0, err
	}
	rank := int(b[3])
	hdrLen = 4 + 4*rank
	if len(b) < hdrLen {
		return nil, 0, 0, errShortHeader()
	}
	dims = make([]int, rank)
	total := uint64(1)
	overflow := false
	for i := range dims {
		d := binary.BigEndian.Uint32(b[4+4*i:])
		hi, lo := bits.Mul64(total, uint64(d))
		if hi != 0 {
			overflow = true
		}
		total = lo
		dims[i] = int(d) // uint32 always fits in int on 64-bit; checked below otherwise
		if uint64(dims[i]) != uint64(d) {
			overflow = true
		}
	}
	limit := uint64(maxIDXBytes)
	if m := uint64(math.MaxInt) - uint64(hdrLen); m < limit {
		limit = m
	}
	if overflow || total > limit {
		return nil, 0, 0, fmt.Errorf("idx: absurd dims %v: %w", rawDims(b, rank), ErrCorrupt)
	}
	return dims, hdrLen, int64(total), nil
}

func rawDims(b []byte, rank int) []uint32 {
	out := make([]uint32, rank)
	for i := range out {
		out[i] = binary.BigEndian.Uint32(b[4+4*i:])
	}
	return out
}

func sizeMismatch(dims []int, want, got int64) error {
	what := "truncated"
	if got > want {
		what = "trailing bytes"
	}
	return fmt.Errorf("idx: %s: dims %v declare %d data bytes, input has %d: %w", what, dims, want, got, ErrCorrupt)
}

// readHeaderPart fills p from r; running out of input is a truncated header.
// Only a clean end of input counts as a short header; other errors (such as
// a cut-off gzip stream) are classified by maybeGzip.
func readHeaderPart(r io.Reader, p []byte, gz bool) error {
	for got, zeroReads := 0, 0; got < len(p); {
		n, err := r.Read(p[got:])
		got += n
		switch {
		case got == len(p):
			return nil
		case err == io.EOF:
			return errShortHeader()
		case err != nil:
			return maybeGzip(err, gz)
		case n == 0:
			if zeroReads++; zeroReads > 100 {
				return io.ErrNoProgress
			}
		}
	}
	return nil
}

// isGzip reports whether br starts with the gzip magic bytes.
func isGzip(br *bufio.Reader) (bool, error) {
	p, err := br.Peek(2)
	if err != nil && err != io.EOF && !errors.Is(err, bufio.ErrBufferFull) {
		return false, err
	}
	return len(p) == 2 && p[0] == gzipID1 && p[1] == gzipID2, nil
}

// maybeGzip classifies err as corruption when it came out of a gzip reader.
func maybeGzip(err error, gz bool) error {
	if !gz {
		return err
	}
	return classifyGzip(err)
}

// classifyGzip wraps ErrCorrupt around errors that mean the gzip stream is
// malformed and returns other (I/O) errors unchanged.
func classifyGzip(err error) error {
	var ce flate.CorruptInputError
	switch {
	case errors.Is(err, gzip.ErrHeader), errors.Is(err, gzip.ErrChecksum),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.As(err, &ce):
		return fmt.Errorf("idx: bad gzip stream (%v): %w", err, ErrCorrupt)
	}
	return err
}

// readAtMost reads from r until it has max bytes or r reports io.EOF. The
// buffer grows geometrically as data arrives, so memory use stays within
// twice the bytes actually read, whatever max is.
func readAtMost(r io.Reader, max int64) ([]byte, error) {
	const initial = 64 << 10
	buf := make([]byte, 0, min(max, initial))
	zeroReads := 0
	for int64(len(buf)) < max {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(2*int64(cap(buf)), max))
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			if zeroReads++; zeroReads > 100 {
				return nil, io.ErrNoProgress
			}
		} else {
			zeroReads = 0
		}
	}
	return buf, nil
}
