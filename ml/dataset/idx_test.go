package dataset

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func TestParseIDXValid(t *testing.T) {
	img := synthImages(4, 3, 2)
	idx, err := ParseIDX(img)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(idx.Dims, []int{4, 3, 2}) {
		t.Errorf("dims = %v", idx.Dims)
	}
	if !bytes.Equal(idx.Data, img[16:]) {
		t.Errorf("data mismatch")
	}
	lbl, err := ParseIDX(synthLabels(7, 3))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(lbl.Dims, []int{7}) || !bytes.Equal(lbl.Data, []byte{0, 1, 2, 0, 1, 2, 0}) {
		t.Errorf("labels = %v %v", lbl.Dims, lbl.Data)
	}
	// Zero samples are valid.
	if idx, err := ParseIDX(idxBytes([]uint32{0, 28, 28}, nil)); err != nil || len(idx.Data) != 0 {
		t.Errorf("empty images: %v %v", idx, err)
	}
}

// readAll decodes b in every way the package offers and checks they agree.
func readAll(t *testing.T, b []byte) (*IDX, error) {
	t.Helper()
	got, err := ReadIDX(bytes.NewReader(b))
	p := writeFile(t, t.TempDir(), "f", b)
	got2, err2 := ReadIDXFile(p)
	if (err == nil) != (err2 == nil) {
		t.Fatalf("ReadIDX err %v, ReadIDXFile err %v", err, err2)
	}
	if err == nil && (!reflect.DeepEqual(got.Dims, got2.Dims) || !bytes.Equal(got.Data, got2.Data)) {
		t.Fatalf("ReadIDX and ReadIDXFile disagree")
	}
	if err2 != nil && !strings.Contains(err2.Error(), p) {
		t.Errorf("ReadIDXFile error %q does not name the file", err2)
	}
	return got, err
}

func TestReadIDXPlainAndGzip(t *testing.T) {
	for _, raw := range [][]byte{synthImages(5, 4, 3), synthLabels(9, 10), idxBytes([]uint32{0}, nil)} {
		want, err := ParseIDX(raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range [][]byte{raw, gzipBytes(t, raw)} {
			got, err := readAll(t, in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Dims, want.Dims) || !bytes.Equal(got.Data, want.Data) {
				t.Errorf("got %v/%d bytes, want %v/%d", got.Dims, len(got.Data), want.Dims, len(want.Data))
			}
		}
	}
	// Concatenated gzip members are one stream.
	raw := synthImages(3, 2, 2)
	multi := append(gzipBytes(t, raw[:10]), gzipBytes(t, raw[10:])...)
	got, err := readAll(t, multi)
	if err != nil || !bytes.Equal(got.Data, raw[16:]) {
		t.Errorf("multi-member gzip: %v", err)
	}
}

func TestReadIDXErrors(t *testing.T) {
	img := synthImages(3, 2, 2)
	badCRC := gzipBytes(t, img)
	badCRC[len(badCRC)-6] ^= 0xff // inside the CRC32 trailer
	cases := []struct {
		name, want string
		in         []byte
	}{
		{"empty", "truncated header", nil},
		{"short magic", "truncated header", []byte{0, 0, 8}},
		{"short dims", "truncated header", []byte{0, 0, 8, 3, 0, 0, 0, 1, 0, 0}},
		{"bad magic", "bad magic 0x12340803", append([]byte{0x12, 0x34}, img[2:]...)},
		{"wrong dtype int32", "element type 0x0c", append([]byte{0, 0, 0x0c}, img[3:]...)},
		{"wrong dtype float", "element type 0x0d", append([]byte{0, 0, 0x0d}, img[3:]...)},
		{"rank 2", "unsupported rank 2", idxBytes([]uint32{3, 4}, make([]byte, 12))},
		{"rank 0", "unsupported rank 0", []byte{0, 0, 8, 0, 1}},
		{"truncated body", "truncated", img[:len(img)-1]},
		{"trailing bytes", "trailing bytes", append(append([]byte{}, img...), 0)},
		{"overflowing dims", "absurd dims", idxBytes([]uint32{0xffffffff, 0xffffffff, 0xffffffff}, nil)},
		{"huge dims", "absurd dims", idxBytes([]uint32{0x10000000, 0x1000, 0x1000}, []byte{1, 2, 3})},
		{"labels truncated", "truncated", synthLabels(10, 2)[:12]},
		{"gzip garbage", "bad gzip stream", []byte{0x1f, 0x8b, 1, 2, 3, 4}},
		{"gzip magic only", "bad gzip stream", []byte{0x1f, 0x8b}},
		{"gzip truncated", "bad gzip stream", gzipBytes(t, img)[:20]},
		{"gzip bad crc", "bad gzip stream", badCRC},
		{"gzip trailing garbage", "bad gzip stream", append(gzipBytes(t, img), 'x', 'y')},
		{"gzip of truncated", "truncated", gzipBytes(t, img[:len(img)-2])},
		{"gzip of trailing", "trailing bytes", gzipBytes(t, append(append([]byte{}, img...), 9))},
		{"gzip of bad magic", "bad magic", gzipBytes(t, []byte{1, 0, 8, 1, 0, 0, 0, 0})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := readAll(t, c.in)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %q, want it to contain %q", err, c.want)
			}
			if len(c.in) < 2 || c.in[0] != 0x1f {
				if _, err := ParseIDX(c.in); !errors.Is(err, ErrCorrupt) {
					t.Errorf("ParseIDX err = %v, want ErrCorrupt", err)
				}
			}
		})
	}
}

// A header that declares far more data than is present must not make the
// reader allocate for the declared size.
func TestReadIDXNoOverAllocation(t *testing.T) {
	// 1e6 * 28 * 28 = 784 MB declared, a few bytes present.
	huge := idxBytes([]uint32{1000000, 28, 28}, make([]byte, 100))
	inputs := map[string][]byte{"plain": huge, "gzip": gzipBytes(t, huge)}
	for name, in := range inputs {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := ReadIDX(bytes.NewReader(in))
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v", name, err)
		}
		if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
			t.Errorf("%s: allocated %d bytes for a %d-byte input", name, d, len(in))
		}
	}
	p := writeFile(t, t.TempDir(), "huge", huge)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadIDXFile(p)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "784000000") {
		t.Errorf("file: err = %v", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("file: allocated %d bytes", d)
	}
}

type failingReader struct {
	data []byte
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// I/O errors are passed through, not reported as corruption.
func TestReadIDXReaderError(t *testing.T) {
	boom := errors.New("boom")
	img := synthImages(100, 5, 5)
	for _, in := range [][]byte{img[:2], img[:30], gzipBytes(t, img)[:30]} {
		_, err := ReadIDX(&failingReader{data: in, err: boom})
		if !errors.Is(err, boom) || errors.Is(err, ErrCorrupt) {
			t.Errorf("err = %v, want boom and not ErrCorrupt", err)
		}
	}
}

func TestReadIDXFileMissing(t *testing.T) {
	_, err := ReadIDXFile(filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v", err)
	}
}

// Small reads (one byte at a time) must work for both paths.
func TestReadIDXOneByteReader(t *testing.T) {
	raw := synthImages(7, 3, 3)
	for _, in := range [][]byte{raw, gzipBytes(t, raw)} {
		got, err := ReadIDX(io.LimitReader(oneByteReader{bytes.NewReader(in)}, 1<<20))
		if err != nil || !bytes.Equal(got.Data, raw[16:]) {
			t.Errorf("err = %v", err)
		}
	}
}

type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

func FuzzReadIDX(f *testing.F) {
	f.Add(synthLabels(3, 2))
	f.Add(synthImages(2, 2, 2))
	f.Add(gzipBytes(f, synthImages(2, 2, 2)))
	f.Add(idxBytes([]uint32{0xffffffff, 0xffffffff, 0xffffffff}, nil))
	f.Fuzz(func(t *testing.T, in []byte) {
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		got, err := ReadIDX(bytes.NewReader(in))
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		gz := len(in) >= 2 && in[0] == 0x1f && in[1] == 0x8b
		if !gz {
			// Plain input: memory is bounded by the input size (plus the
			// reader's fixed buffers).
			if d := after.TotalAlloc - before.TotalAlloc; d > uint64(4*len(in))+256<<10 {
				t.Fatalf("allocated %d bytes for %d input bytes", d, len(in))
			}
			parsed, perr := ParseIDX(in)
			if (err == nil) != (perr == nil) {
				t.Fatalf("ReadIDX err %v but ParseIDX err %v", err, perr)
			}
			if err == nil && (!reflect.DeepEqual(got.Dims, parsed.Dims) || !bytes.Equal(got.Data, parsed.Data)) {
				t.Fatalf("ReadIDX and ParseIDX disagree")
			}
		}
		if err != nil {
			return
		}
		n := 1
		for _, d := range got.Dims {
			n *= d
		}
		if n != len(got.Data) || (len(got.Dims) != 1 && len(got.Dims) != 3) {
			t.Fatalf("dims %v but %d data bytes", got.Dims, len(got.Data))
		}
		if len(got.Dims) == 3 && got.Dims[0] <= len(in) {
			// Pair with matching labels: must not panic either.
			lbl, _ := ParseIDX(idxBytes([]uint32{uint32(got.Dims[0])}, make([]byte, got.Dims[0])))
			if ds, err := NewDataset(got, lbl); err == nil && len(ds.Images) != ds.N*ds.Dim {
				t.Fatalf("dataset size mismatch")
			}
		}
	})
}
