package dataset

import (
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

// idxBytes builds an IDX file with the given magic type/rank and dims, and
// data as body.
func idxBytes(dims []uint32, body []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, d)
	}
	b.Write(body)
	return b.Bytes()
}

// synthImages returns an images IDX of n images of rows*cols pixels where
// pixel p of image i is byte(i*7 + p*3).
func synthImages(n, rows, cols int) []byte {
	body := make([]byte, n*rows*cols)
	for i := 0; i < n; i++ {
		for p := 0; p < rows*cols; p++ {
			body[i*rows*cols+p] = byte(i*7 + p*3)
		}
	}
	return idxBytes([]uint32{uint32(n), uint32(rows), uint32(cols)}, body)
}

// synthLabels returns a labels IDX with label i%classes for sample i.
func synthLabels(n, classes int) []byte {
	body := make([]byte, n)
	for i := range body {
		body[i] = byte(i % classes)
	}
	return idxBytes([]uint32{uint32(n)}, body)
}

func gzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func md5Hex(b []byte) string {
	s := md5.Sum(b)
	return hex.EncodeToString(s[:])
}

func writeFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// synthSet is a tiny MNIST-like set: raw IDX files and a setSpec whose
// checksums match them.
type synthSet struct {
	spec  setSpec
	files [4][]byte
}

func newSynthSet() synthSet {
	var s synthSet
	s.files = [4][]byte{
		synthImages(10, 3, 2), synthLabels(10, 4),
		synthImages(5, 3, 2), synthLabels(5, 3),
	}
	s.spec = mnistSpec()
	s.spec.name = "synth"
	for i := range s.spec.files {
		s.spec.files[i].size = int64(len(s.files[i]))
		s.spec.files[i].md5 = md5Hex(s.files[i])
	}
	return s
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}
