package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"slices"
	"sort"
	"strconv"
	"unicode/utf8"
)

// ErrCorrupt is wrapped by every error that reports a structurally invalid
// or damaged safetensors file, manifest or checkpoint.
var ErrCorrupt = errors.New("checkpoint: corrupt data")

// ErrUnsupportedDtype is wrapped by errors reporting a well-formed
// safetensors tensor whose dtype is neither F32 nor U64.
var ErrUnsupportedDtype = errors.New("checkpoint: unsupported dtype")

// Tensor is a named tensor of float32 (dtype F32, the default) or uint64
// (dtype U64: the keys of embedding rows). Data, or U64 for a U64
// tensor, holds the elements in row-major order; its length must equal
// the product of Shape (1 for a scalar, whose Shape is empty).
//
// An F32 tensor may give its elements as Parts instead of Data: Elems of
// them, in row-major order, over the parts Parts yields (each time it is
// ranged over, the same; the writer may range over it twice at once, to
// write and to hash, so it must only read). A tensor gathered from
// storage that is not one slice (a table's rows in key order) is so
// written without a copy of it all.
type Tensor struct {
	Name  string
	Shape []int
	Data  []float32
	// DType is F32 ("" too) or U64.
	DType string
	U64   []uint64
	Parts iter.Seq[[]float32]
	Elems int // with Parts: how many elements they hold
}

// The dtypes this package writes and reads.
const (
	F32 = "F32"
	U64 = "U64"
)

// isU64 says the tensor's elements are U64's.
func (t Tensor) isU64() bool { return t.DType == U64 }

// elems is the tensor's element count.
func (t Tensor) elems() int {
	switch {
	case t.isU64():
		return len(t.U64)
	case t.Parts != nil:
		return t.Elems
	}
	return len(t.Data)
}

// elemSize is the bytes of one element of dtype dt.
func elemSize(dt string) int64 {
	if dt == U64 {
		return 8
	}
	return 4
}

const (
	// maxHeaderSize bounds the JSON header, as the reference
	// implementation does (100 MB).
	maxHeaderSize = 100_000_000
	// metadataKey is the reserved header key holding string metadata.
	metadataKey = "__metadata__"
	// chunkSize is the buffer size of the portable (big-endian) path.
	chunkSize = 64 << 10
	// skipSize is the buffer a read skipping a tensor (its bytes read
	// and hashed, not kept) reads through: a table's rows are most of a
	// CTR shard's file.
	skipSize = 1 << 20
)

// isKnownDtype reports whether dt is a safetensors dtype name other than
// F32 and U64: a file using one is valid but unsupported here.
func isKnownDtype(dt string) bool {
	switch dt {
	case "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3",
		"F6_E3M2", "I16", "U16", "F16", "BF16", "I32", "U32", "F64", "I64",
		"C64":
		return true
	}
	return false
}

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// WriteSafetensors writes tensors (F32 or U64) and meta to w in the safetensors
// format: an 8-byte little-endian header length N, an N-byte JSON header
// padded with spaces to a multiple of 8, then the tensors' data, contiguous
// and in the order given. It returns the number of bytes written. Nothing is
// written if the tensors are invalid (duplicate or reserved names, invalid
// UTF-8, negative dimensions, or len(Data) different from the shape's
// product).
func WriteSafetensors(w io.Writer, tensors []Tensor, meta map[string]string) (int64, error) {
	header, err := buildHeader(tensors, meta)
	if err != nil {
		return 0, err
	}
	return writeWithHeader(w, header, tensors, hostLittleEndian())
}

// numElements returns the product of shape, or an error if a dimension is
// negative or the product exceeds limit.
func numElements(shape []int, limit int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension %d in shape %v", d, shape)
		}
		if d == 0 {
			n = 0
		}
	}
	if n == 0 {
		return 0, nil
	}
	for _, d := range shape {
		if int64(d) > limit/n {
			return 0, fmt.Errorf("shape %v has more than %d elements", shape, limit)
		}
		n *= int64(d)
	}
	return n, nil
}

// buildHeader validates tensors and meta and returns the length prefix plus
// the padded JSON header.
func buildHeader(tensors []Tensor, meta map[string]string) ([]byte, error) {
	var b bytes.Buffer
	b.Write(make([]byte, 8)) // length prefix, filled in below
	b.WriteByte('{')
	if err := writeMetadata(&b, meta); err != nil {
		return nil, err
	}
	first := len(meta) == 0
	seen := make(map[string]bool, len(tensors))
	var offset int64
	for _, t := range tensors {
		n, err := checkTensor(t, seen)
		if err != nil {
			return nil, err
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		offset = writeTensorEntry(&b, t, offset, n)
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	out := b.Bytes()
	binary.LittleEndian.PutUint64(out, uint64(len(out)-8))
	return out, nil
}

// writeMetadata writes the header's metadata entry, keys sorted, or
// nothing when meta is empty.
func writeMetadata(b *bytes.Buffer, meta map[string]string) error {
	if len(meta) == 0 {
		return nil
	}
	keys := make([]string, 0, len(meta))
	for k, v := range meta {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("checkpoint: metadata %q: invalid UTF-8", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString(`"` + metadataKey + `":{`)
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		appendJSONString(b, k)
		b.WriteByte(':')
		appendJSONString(b, meta[k])
	}
	b.WriteByte('}')
	return nil
}

// checkTensor validates t's name (not reserved, valid UTF-8, not in seen,
// to which it is added) and shape, and returns its number of elements.
func checkTensor(t Tensor, seen map[string]bool) (int64, error) {
	switch {
	case t.Name == metadataKey:
		return 0, fmt.Errorf("checkpoint: tensor name %q is reserved", t.Name)
	case !utf8.ValidString(t.Name):
		return 0, fmt.Errorf("checkpoint: tensor name %q: invalid UTF-8", t.Name)
	case seen[t.Name]:
		return 0, fmt.Errorf("checkpoint: duplicate tensor name %q", t.Name)
	case t.DType != "" && t.DType != F32 && t.DType != U64:
		return 0, fmt.Errorf("checkpoint: tensor %q: dtype %q (want F32 or U64)", t.Name, t.DType)
	}
	seen[t.Name] = true
	n, err := numElements(t.Shape, math.MaxInt64/4)
	if err != nil {
		return 0, fmt.Errorf("checkpoint: tensor %q: %w", t.Name, err)
	}
	if n != int64(t.elems()) {
		return 0, fmt.Errorf("checkpoint: tensor %q: shape %v needs %d elements, have %d",
			t.Name, t.Shape, n, t.elems())
	}
	return n, nil
}

// writeTensorEntry writes t's header entry, its n elements starting at
// byte offset of the data section, and returns the offset past them.
func writeTensorEntry(b *bytes.Buffer, t Tensor, offset, n int64) int64 {
	appendJSONString(b, t.Name)
	dt := F32
	if t.isU64() {
		dt = U64
	}
	b.WriteString(`:{"dtype":"` + dt + `","shape":[`)
	for i, d := range t.Shape {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(d))
	}
	end := offset + elemSize(dt)*n
	fmt.Fprintf(b, `],"data_offsets":[%d,%d]}`, offset, end)
	return end
}

func appendJSONString(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s) // cannot fail for a string
	b.Write(q)
}

// writeWithHeader writes a header produced by buildHeader(tensors, ...)
// followed by the tensor data. native selects the zero-copy path, valid only
// on little-endian hosts.
func writeWithHeader(w io.Writer, header []byte, tensors []Tensor, native bool) (int64, error) {
	written := int64(0)
	n, err := w.Write(header)
	written += int64(n)
	if err != nil {
		return written, fmt.Errorf("checkpoint: writing safetensors header: %w", err)
	}
	var buf []byte
	for _, t := range tensors {
		if t.isU64() {
			n, err := writeU64s(w, t.U64, native)
			written += n
			if err != nil {
				return written, fmt.Errorf("checkpoint: writing tensor %q: %w", t.Name, err)
			}
			continue
		}
		if t.Parts != nil {
			if buf == nil {
				buf = make([]byte, chunkSize)
			}
			n, err := writeParts(w, t, buf, native)
			written += n
			if err != nil {
				return written, fmt.Errorf("checkpoint: writing tensor %q: %w", t.Name, err)
			}
			continue
		}
		if native {
			n, err = w.Write(f32Bytes(t.Data))
			written += int64(n)
			if err != nil {
				return written, fmt.Errorf("checkpoint: writing tensor %q: %w", t.Name, err)
			}
			continue
		}
		if buf == nil {
			buf = make([]byte, chunkSize)
		}
		for data := t.Data; len(data) > 0; {
			k := min(len(data), chunkSize/4)
			putF32sLE(buf, data[:k])
			n, err = w.Write(buf[:4*k])
			written += int64(n)
			if err != nil {
				return written, fmt.Errorf("checkpoint: writing tensor %q: %w", t.Name, err)
			}
			data = data[k:]
		}
	}
	return written, nil
}

// writeParts writes a tensor given as Parts, gathered into buf (of
// chunkSize bytes) so that small parts make few writes; native copies
// the parts' bytes as they are (little-endian hosts only).
func writeParts(w io.Writer, t Tensor, buf []byte, native bool) (int64, error) {
	var written int64
	used, elems := 0, 0
	flush := func() error {
		n, err := w.Write(buf[:used])
		written += int64(n)
		used = 0
		return err
	}
	for part := range t.Parts {
		elems += len(part)
		if elems > t.Elems {
			return written, fmt.Errorf("its parts hold more than its %d elements", t.Elems)
		}
		for len(part) > 0 {
			k := min(len(part), (len(buf)-used)/4)
			if native {
				copy(buf[used:], f32Bytes(part[:k]))
			} else {
				putF32sLE(buf[used:], part[:k])
			}
			used += 4 * k
			part = part[k:]
			if used+4 > len(buf) {
				if err := flush(); err != nil {
					return written, err
				}
			}
		}
	}
	if elems != t.Elems {
		return written, fmt.Errorf("its parts hold %d elements, not its %d", elems, t.Elems)
	}
	return written, flush()
}

// tensorEntry is one parsed header entry.
type tensorEntry struct {
	name       string
	dtype      string
	shape      []int
	begin, end int64
}

// ReadSafetensors reads a safetensors file of the given size from r and
// returns its tensors in header order and its metadata (nil if absent).
//
// Validation is strict: the header length must fit in the file, the header
// must be a single JSON object with unique keys, each tensor must have
// exactly dtype, shape and data_offsets, the data offsets must tile the
// data section exactly (contiguous from 0 to its end, no gaps, no overlap),
// and each tensor's byte length must equal its element size (4 for F32, 8
// for U64) times its shape's product.
// Structural problems are reported wrapping ErrCorrupt; a well-formed
// tensor of another dtype wraps ErrUnsupportedDtype. Memory allocated is
// bounded by the file size, whatever the header claims.
func ReadSafetensors(r io.ReaderAt, size int64) ([]Tensor, map[string]string, error) {
	return readSafetensors(r, size, hostLittleEndian(), nil)
}

// readSafetensors is ReadSafetensors; with keep (nil: every tensor), the
// data of a tensor keep refuses is read past (every byte of the file is
// still read, in order) and not kept: its Tensor has its name, shape and
// type and no data.
func readSafetensors(r io.ReaderAt, size int64, native bool, keep func(name string) bool) ([]Tensor, map[string]string, error) {
	header, err := readHeader(r, size)
	if err != nil {
		return nil, nil, err
	}
	entries, meta, err := parseHeader(header)
	if err != nil {
		return nil, nil, err
	}
	dataStart := 8 + int64(len(header))
	dataLen := size - dataStart
	if err := checkLayout(entries, dataLen); err != nil {
		return nil, nil, err
	}

	// Read in offset order (sequential I/O), return in header order.
	order := make([]int, len(entries))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return entries[order[a]].begin < entries[order[b]].begin })
	tensors := make([]Tensor, len(entries))
	var buf, skip []byte
	if !native && len(entries) > 0 {
		buf = make([]byte, chunkSize)
	}
	for _, i := range order {
		e := entries[i]
		if keep != nil && !keep(e.name) {
			if skip == nil {
				skip = make([]byte, skipSize) // (not buf: nil keeps the kept tensors' reads direct)
			}
			if err := readPast(r, dataStart+e.begin, e.end-e.begin, skip); err != nil {
				return nil, nil, fmt.Errorf("tensor %q: %w", e.name, err)
			}
			tensors[i] = Tensor{Name: e.name, Shape: e.shape, DType: e.dtype}
			continue
		}
		if e.dtype == U64 {
			data := make([]uint64, (e.end-e.begin)/8)
			if err := readU64s(r, data, dataStart+e.begin, native); err != nil {
				return nil, nil, fmt.Errorf("tensor %q: %w", e.name, err)
			}
			tensors[i] = Tensor{Name: e.name, Shape: e.shape, DType: U64, U64: data}
			continue
		}
		data := make([]float32, (e.end-e.begin)/4)
		if err := readTensorData(r, data, dataStart+e.begin, buf); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", e.name, err)
		}
		tensors[i] = Tensor{Name: e.name, Shape: e.shape, Data: data}
	}
	return tensors, meta, nil
}

// readHeader reads and bounds-checks the length prefix of a file of the
// given size and returns the JSON header it announces.
func readHeader(r io.ReaderAt, size int64) ([]byte, error) {
	if size < 8 {
		return nil, corruptf("file of %d bytes is shorter than the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if err := readFullAt(r, lenBuf[:], 0); err != nil {
		return nil, err
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if hlen < 2 || hlen > maxHeaderSize || hlen > uint64(size-8) {
		return nil, corruptf("header length %d invalid for a file of %d bytes", hlen, size)
	}
	header := make([]byte, hlen)
	if err := readFullAt(r, header, 8); err != nil {
		return nil, err
	}
	return header, nil
}

// readTensorData fills data from the little-endian float32s at off. With a
// nil buf it reads straight into data's memory (native little-endian
// hosts only); otherwise it decodes through buf, chunkSize bytes at a time.
func readTensorData(r io.ReaderAt, data []float32, off int64, buf []byte) error {
	if buf == nil {
		return readFullAt(r, f32Bytes(data), off)
	}
	for rest := data; len(rest) > 0; {
		k := min(len(rest), chunkSize/4)
		if err := readFullAt(r, buf[:4*k], off); err != nil {
			return err
		}
		getF32sLE(rest[:k], buf)
		off += int64(4 * k)
		rest = rest[k:]
	}
	return nil
}

// readPast reads n bytes of r from off through buf, keeping none: a
// reader that hashes what it reads (Checkpoint.ReadShardSome) still sees
// them.
func readPast(r io.ReaderAt, off, n int64, buf []byte) error {
	for n > 0 {
		k := min(n, int64(len(buf)))
		if err := readFullAt(r, buf[:k], off); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// readFullAt fills p from r at off. A short read is reported as corruption
// (the file is shorter than its declared size); other I/O errors are
// returned wrapped as they are.
func readFullAt(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return corruptf("unexpected end of file reading %d bytes at offset %d (got %d)", len(p), off, n)
	}
	return fmt.Errorf("checkpoint: reading %d bytes at offset %d: %w", len(p), off, err)
}

// checkLayout verifies that the entries' byte ranges tile [0, dataLen)
// exactly and that each range matches its shape.
func checkLayout(entries []tensorEntry, dataLen int64) error {
	sorted := slices.Clone(entries)
	sort.SliceStable(sorted, func(a, b int) bool {
		if sorted[a].begin != sorted[b].begin {
			return sorted[a].begin < sorted[b].begin
		}
		return sorted[a].end < sorted[b].end
	})
	var pos int64
	for _, e := range sorted {
		if e.begin > e.end {
			return corruptf("tensor %q: data_offsets [%d,%d] reversed", e.name, e.begin, e.end)
		}
		if e.end > dataLen {
			return corruptf("tensor %q: data_offsets [%d,%d] beyond the %d-byte data section", e.name, e.begin, e.end, dataLen)
		}
		if e.begin != pos {
			return corruptf("tensor %q: data_offsets [%d,%d] not contiguous (expected begin %d)", e.name, e.begin, e.end, pos)
		}
		size := elemSize(e.dtype)
		n, err := numElements(e.shape, dataLen/size)
		if err != nil {
			return corruptf("tensor %q: %v", e.name, err)
		}
		if size*n != e.end-e.begin {
			return corruptf("tensor %q: shape %v needs %d bytes, data_offsets give %d", e.name, e.shape, size*n, e.end-e.begin)
		}
		pos = e.end
	}
	if pos != dataLen {
		return corruptf("data section is %d bytes but tensors cover %d", dataLen, pos)
	}
	return nil
}

// parseHeader decodes the JSON header strictly: one object, unique keys,
// nothing but whitespace after it.
func parseHeader(header []byte) ([]tensorEntry, map[string]string, error) {
	if header[0] != '{' {
		return nil, nil, corruptf("header does not start with '{'")
	}
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	var (
		entries []tensorEntry
		meta    map[string]string
	)
	seen := make(map[string]bool)
	err := decodeObject(dec, func(key string) error {
		if seen[key] {
			return fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		if key == metadataKey {
			m, err := decodeMetadata(dec)
			meta = m
			return err
		}
		e, err := decodeTensorInfo(dec, key)
		if err != nil {
			return err
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, nil, corruptf("trailing data after the header object")
	}
	return entries, meta, nil
}

// headerErr converts an error met while decoding the header into one
// wrapping ErrCorrupt (unless it already wraps a sentinel of ours).
func headerErr(err error) error {
	if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnsupportedDtype) {
		return err
	}
	return corruptf("header: %v", err)
}

// decodeObject consumes a JSON object from dec, calling field for each key
// with dec positioned at the key's value; field must consume the value.
func decodeObject(dec *json.Decoder, field func(key string) error) error {
	if err := expectDelim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return headerErr(err)
		}
		key, ok := tok.(string)
		if !ok {
			return corruptf("header: expected object key, got %v", tok)
		}
		if err := field(key); err != nil {
			return headerErr(err)
		}
	}
	return expectDelim(dec, '}')
}

func expectDelim(dec *json.Decoder, d json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return headerErr(err)
	}
	if got, ok := tok.(json.Delim); !ok || got != d {
		return corruptf("header: expected %q, got %v", d, tok)
	}
	return nil
}

func decodeMetadata(dec *json.Decoder) (map[string]string, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, headerErr(err)
	}
	if tok == nil {
		return nil, nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, corruptf("header: %s must be an object of strings", metadataKey)
	}
	meta := make(map[string]string)
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, headerErr(err)
		}
		k, ok := kt.(string)
		if !ok {
			return nil, corruptf("header: bad metadata key %v", kt)
		}
		if _, dup := meta[k]; dup {
			return nil, corruptf("header: duplicate metadata key %q", k)
		}
		vt, err := dec.Token()
		if err != nil {
			return nil, headerErr(err)
		}
		v, ok := vt.(string)
		if !ok {
			return nil, corruptf("header: metadata %q is not a string", k)
		}
		meta[k] = v
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, err
	}
	return meta, nil
}

func decodeTensorInfo(dec *json.Decoder, name string) (tensorEntry, error) {
	e := tensorEntry{name: name}
	seen := map[string]bool{}
	err := decodeObject(dec, func(key string) error {
		if seen[key] {
			return corruptf("tensor %q: duplicate %s", name, key)
		}
		seen[key] = true
		return e.decodeField(dec, key)
	})
	if err != nil {
		return e, err
	}
	if !seen["dtype"] || !seen["shape"] || !seen["data_offsets"] {
		return e, corruptf("tensor %q: needs dtype, shape and data_offsets", name)
	}
	return e, nil
}

// decodeField decodes the value of the header field key into e.
func (e *tensorEntry) decodeField(dec *json.Decoder, key string) error {
	switch key {
	case "dtype":
		dt, err := decodeDtype(dec, e.name)
		e.dtype = dt
		return err
	case "shape":
		dims, err := decodeInts(dec, math.MaxInt)
		if err != nil {
			return fmt.Errorf("tensor %q: shape: %w", e.name, err)
		}
		e.shape = make([]int, len(dims))
		for i, d := range dims {
			e.shape[i] = int(d)
		}
	case "data_offsets":
		offs, err := decodeInts(dec, math.MaxInt64)
		if err != nil {
			return fmt.Errorf("tensor %q: data_offsets: %w", e.name, err)
		}
		if len(offs) != 2 {
			return corruptf("tensor %q: data_offsets has %d entries, want 2", e.name, len(offs))
		}
		e.begin, e.end = offs[0], offs[1]
	default:
		return corruptf("tensor %q: unknown field %q", e.name, key)
	}
	return nil
}

// decodeDtype decodes a tensor's dtype, which must be F32 or U64.
func decodeDtype(dec *json.Decoder, name string) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", err
	}
	dt, ok := tok.(string)
	if !ok {
		return "", corruptf("tensor %q: dtype is not a string", name)
	}
	if dt == F32 || dt == U64 {
		return dt, nil
	}
	if isKnownDtype(dt) {
		return "", fmt.Errorf("%w: tensor %q has dtype %s, only F32 and U64 are supported", ErrUnsupportedDtype, name, dt)
	}
	return "", corruptf("tensor %q: unknown dtype %q", name, dt)
}

// decodeInts decodes a JSON array of non-negative integers no larger than
// limit.
func decodeInts(dec *json.Decoder, limit int64) ([]int64, error) {
	if err := expectDelim(dec, '['); err != nil {
		return nil, err
	}
	var out []int64
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, headerErr(err)
		}
		num, ok := tok.(json.Number)
		if !ok {
			return nil, corruptf("expected an integer, got %v", tok)
		}
		v, err := strconv.ParseInt(string(num), 10, 64)
		if err != nil || v < 0 || v > limit {
			return nil, corruptf("invalid non-negative integer %s", num)
		}
		out = append(out, v)
	}
	if err := expectDelim(dec, ']'); err != nil {
		return nil, err
	}
	return out, nil
}
