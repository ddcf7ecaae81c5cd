package dataset

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// readIDXRows reads some of the images of the rank-3 images IDX file at
// path ([N, rows, cols]): image rows[k] becomes bytes [k*D, (k+1)*D) of
// data, D = rows*cols. rows must be ascending, without repeats, each in
// [0, N). It returns the file's dimensions too.
//
// Only those images are held. An uncompressed file is checked against
// its header's length first and then read with one positioned read per
// run of consecutive images (a worker's contiguous shard: one read). A
// gzip-compressed file cannot be seeked: it is decompressed once, start
// to end, keeping those images and checking its length and CRC as
// ReadIDXFile does. Malformed files give errors wrapping ErrCorrupt.
func readIDXRows(path string, rows []int) (dims []int, data []byte, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	dims, data, err = readRowsFrom(f, rows)
	if err != nil {
		return nil, nil, fmt.Errorf("data: %s: %w", path, err)
	}
	return dims, data, nil
}

func readRowsFrom(f *os.File, rows []int) (dims []int, data []byte, err error) {
	br := bufio.NewReader(f)
	gz, err := isGzip(br)
	if err != nil {
		return nil, nil, err
	}
	var src io.Reader = br
	if gz {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, classifyGzip(err)
		}
		defer zr.Close()
		src = zr
	}
	dims, hdrLen, body, err := readIDXHeader(src, gz)
	if err != nil {
		return nil, nil, err
	}
	if len(dims) != 3 {
		return nil, nil, fmt.Errorf("idx: images must have rank 3 [N, rows, cols], got dims %v: %w", dims, ErrCorrupt)
	}
	if err := checkRows(rows, dims[0]); err != nil {
		return nil, nil, err
	}
	rowLen := int64(dims[1]) * int64(dims[2])
	if !gz {
		st, err := f.Stat()
		if err != nil {
			return nil, nil, err
		}
		if got := st.Size() - int64(hdrLen); got != body {
			return nil, nil, sizeMismatch(dims, body, got)
		}
		data, err := readRowsAt(f, int64(hdrLen), rowLen, rows)
		return dims, data, err
	}
	data, err = readRowsStream(src, rowLen, int64(dims[0]), rows)
	if err != nil {
		return nil, nil, maybeGzip(err, true)
	}
	return dims, data, nil
}

// checkRows checks that rows is ascending without repeats, within [0, n).
func checkRows(rows []int, n int) error {
	for k, r := range rows {
		if r < 0 || r >= n || (k > 0 && r <= rows[k-1]) {
			return fmt.Errorf("idx: rows must be ascending and distinct in [0, %d): row %d is %d", n, k, r)
		}
	}
	return nil
}

// readRowsAt reads rows of rowLen bytes from an uncompressed body that
// starts at offset off, one read per run of consecutive rows.
func readRowsAt(r io.ReaderAt, off, rowLen int64, rows []int) ([]byte, error) {
	data := make([]byte, int64(len(rows))*rowLen)
	for k := 0; k < len(rows); {
		run := 1
		for k+run < len(rows) && rows[k+run] == rows[k]+run {
			run++
		}
		dst := data[int64(k)*rowLen : int64(k+run)*rowLen]
		if _, err := r.ReadAt(dst, off+int64(rows[k])*rowLen); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("idx: file shrank while reading: %w", ErrCorrupt)
			}
			return nil, err
		}
		k += run
	}
	return data, nil
}

// readRowsStream reads the body of n rows of rowLen bytes from r, keeping
// rows, then checks that nothing follows it. Memory grows only as data
// arrives.
func readRowsStream(r io.Reader, rowLen, n int64, rows []int) ([]byte, error) {
	var kept bytes.Buffer
	next := int64(0) // the row r is at
	skip := func(to int64) error {
		if got, err := io.CopyN(io.Discard, r, (to-next)*rowLen); err != nil {
			return streamShort(err, next*rowLen+got, n*rowLen)
		}
		next = to
		return nil
	}
	for _, row := range rows {
		if err := skip(int64(row)); err != nil {
			return nil, err
		}
		if got, err := io.CopyN(&kept, r, rowLen); err != nil {
			return nil, streamShort(err, next*rowLen+got, n*rowLen)
		}
		next++
	}
	if err := skip(n); err != nil {
		return nil, err
	}
	var one [1]byte
	m, err := io.ReadFull(r, one[:])
	if m > 0 {
		return nil, fmt.Errorf("idx: trailing bytes after the %d-byte body: %w", n*rowLen, ErrCorrupt)
	}
	if err != nil && err != io.EOF {
		return nil, err
	}
	return slices.Clip(kept.Bytes()), nil
}

// streamShort is the error for a body that ended (err io.EOF) after got of
// its want bytes, or err itself.
func streamShort(err error, got, want int64) error {
	if err == io.EOF {
		return fmt.Errorf("idx: truncated: the header declares %d data bytes, input has %d: %w", want, got, ErrCorrupt)
	}
	return err
}

// readIDXDims reads the dimensions of the IDX file at path from its
// header. An uncompressed file's length is checked against them; a
// gzip-compressed one is only checked as far as its header.
func readIDXDims(path string) ([]int, error) {
	r, gz, size, closeFn, err := openData(path)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	dims, hdrLen, body, err := readIDXHeader(r, gz)
	if err == nil && !gz {
		if got := size - int64(hdrLen); got != body {
			err = sizeMismatch(dims, body, got)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", path, err)
	}
	return dims, nil
}
