package dataset

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeSynth(t *testing.T, dir string, s synthSet, gz [4]bool) {
	t.Helper()
	for i, f := range s.spec.files {
		if gz[i] {
			writeFile(t, dir, f.name+".gz", gzipBytes(t, s.files[i]))
		} else {
			writeFile(t, dir, f.name, s.files[i])
		}
	}
}

func checkSynthSets(t *testing.T, train, test *Dataset) {
	t.Helper()
	if train.N != 10 || test.N != 5 || train.Dim != 6 || test.Dim != 6 {
		t.Fatalf("train N=%d Dim=%d, test N=%d Dim=%d", train.N, train.Dim, test.N, test.Dim)
	}
	// Train labels go up to 3, test labels up to 2: both get 4 classes.
	if train.Classes != 4 || test.Classes != 4 {
		t.Errorf("classes %d/%d, want 4/4", train.Classes, test.Classes)
	}
	if want := float32(byte(2*7+5*3)) / 255; train.Image(2)[5] != want || train.Labels[7] != 3 {
		t.Errorf("content mismatch")
	}
}

func TestLoadVerified(t *testing.T) {
	s := newSynthSet()
	for _, gz := range [][4]bool{{}, {true, true, true, true}, {true, false, false, true}} {
		dir := t.TempDir()
		writeSynth(t, dir, s, gz)
		train, test, err := loadVerified(dir, s.spec)
		if err != nil {
			t.Fatalf("gz=%v: %v", gz, err)
		}
		checkSynthSets(t, train, test)
	}
}

func TestLoadVerifiedChecksum(t *testing.T) {
	s := newSynthSet()
	for _, gz := range []bool{false, true} {
		dir := t.TempDir()
		writeSynth(t, dir, s, [4]bool{})
		bad := append([]byte{}, s.files[2]...)
		bad[20] ^= 1 // same size, different content
		name := s.spec.files[2].name
		os.Remove(filepath.Join(dir, name))
		if gz {
			name += ".gz"
			bad = gzipBytes(t, bad)
		}
		p := writeFile(t, dir, name, bad)
		_, _, err := loadVerified(dir, s.spec)
		if !errors.Is(err, ErrChecksum) {
			t.Fatalf("err = %v, want ErrChecksum", err)
		}
		for _, want := range []string{p, s.spec.files[2].md5, "pstrain data fetch --dataset synth --data-dir " + dir} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not mention %q", err, want)
			}
		}
	}
}

// Every kind of wrong file is a checksum error naming the file, both sums
// and the fix. The first cases use the real MNIST sums.
func TestLoadChecksumMismatch(t *testing.T) {
	s := newSynthSet()
	mnist := mnistSpec()
	size := s.spec.files[0].size
	cases := []struct {
		name    string
		spec    setSpec
		content []byte
	}{
		{"mnist wrong size", mnist, s.files[0]},
		{"mnist wrong size gzip", mnist, gzipBytes(t, s.files[0])},
		{"right size, garbage", s.spec, make([]byte, size)},
		{"right size, garbage gzip", s.spec, gzipBytes(t, make([]byte, size))},
		{"too big gzip", s.spec, gzipBytes(t, make([]byte, size+1000))},
		{"too small gzip", s.spec, gzipBytes(t, s.files[0][:size-1])},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeSynth(t, dir, s, [4]bool{})
			p := writeFile(t, dir, c.spec.files[0].name, c.content)
			_, _, err := loadVerified(dir, c.spec)
			if !errors.Is(err, ErrChecksum) {
				t.Fatalf("err = %v, want ErrChecksum", err)
			}
			plain := c.content
			if plain[0] == 0x1f {
				plain = gunzip(t, plain)
			}
			for _, want := range []string{p, md5Hex(plain), c.spec.files[0].md5,
				"pstrain data fetch --dataset " + c.spec.name + " --data-dir " + dir} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
	// Through the public entry point.
	dir := t.TempDir()
	writeSynth(t, dir, s, [4]bool{})
	if _, _, err := Load(dir, "mnist"); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "pstrain data fetch --dataset mnist") {
		t.Errorf("Load: err = %v", err)
	}
}

func TestLoadMNISTMissing(t *testing.T) {
	dir := t.TempDir()
	_, _, err := Load(dir, "mnist")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want ErrNotExist", err)
	}
	for _, want := range []string{filepath.Join(dir, "train-images-idx3-ubyte"), "pstrain data fetch --dataset mnist --data-dir " + dir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// A later missing file is named too.
	s := newSynthSet()
	writeSynth(t, dir, s, [4]bool{})
	os.Remove(filepath.Join(dir, "t10k-labels-idx1-ubyte"))
	_, _, err = loadVerified(dir, s.spec)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "t10k-labels-idx1-ubyte") {
		t.Errorf("err = %v", err)
	}
	if !strings.Contains(fetchCommand("/my data", s.spec), "--data-dir '/my data'") {
		t.Errorf("directory with a space is not quoted: %s", fetchCommand("/my data", s.spec))
	}
}

func TestLoadIDX(t *testing.T) {
	s := newSynthSet()
	dir := t.TempDir()
	names := []string{"a-img", "a-lbl.gz", "b-img.gz", "b-lbl"}
	for i, n := range names {
		b := s.files[i]
		if strings.HasSuffix(n, ".gz") {
			b = gzipBytes(t, b)
		}
		writeFile(t, dir, n, b)
	}
	// Relative to dir, absolute, and with spaces around commas.
	spec := "idx:a-img, " + filepath.Join(dir, "a-lbl.gz") + ",b-img.gz ,b-lbl"
	train, test, err := Load(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	checkSynthSets(t, train, test)

	// Count mismatch: train images with test labels.
	_, _, err = Load(dir, "idx:a-img,b-lbl,b-img.gz,b-lbl")
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "10 images but 5 labels") {
		t.Errorf("count mismatch: %v", err)
	}
	// Train and test image sizes differ.
	writeFile(t, dir, "c-img", synthImages(5, 2, 2))
	_, _, err = Load(dir, "idx:a-img,a-lbl.gz,c-img,b-lbl")
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("dim mismatch: %v", err)
	}
	// Corrupt file.
	writeFile(t, dir, "bad", []byte{0, 0, 8, 1, 0, 0, 0, 9, 1})
	_, _, err = Load(dir, "idx:a-img,bad,b-img.gz,b-lbl")
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), filepath.Join(dir, "bad")) {
		t.Errorf("corrupt: %v", err)
	}
	for _, name := range []string{"idx:a,b,c", "idx:a,b,,d", "idx:", "cifar10", ""} {
		if _, _, err := Load(dir, name); err == nil {
			t.Errorf("Load(%q) succeeded", name)
		}
	}
	if _, _, err := Load(dir, "idx:a-img,a-lbl.gz,b-img.gz,nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
}

// TestLoadRealMNIST runs against real MNIST files when PSTRAIN_DATA_DIR names
// a directory that holds them (as written by `pstrain data fetch`).
func TestLoadRealMNIST(t *testing.T) {
	dir := os.Getenv("PSTRAIN_DATA_DIR")
	if dir == "" {
		t.Skip("PSTRAIN_DATA_DIR not set")
	}
	if _, err := locate(dir, "train-images-idx3-ubyte"); err != nil {
		t.Skipf("no MNIST in %s: %v", dir, err)
	}
	train, test, err := Load(dir, "mnist")
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 60000 || test.N != 10000 || train.Dim != 784 || train.Classes != 10 || test.Classes != 10 {
		t.Fatalf("train N=%d Dim=%d Classes=%d, test N=%d", train.N, train.Dim, train.Classes, test.N)
	}
	// Well-known facts: the first training labels are 5 0 4 1 9, the first
	// test labels 7 2 1 0 4.
	if got := train.Labels[:5]; string(got) != "\x05\x00\x04\x01\x09" {
		t.Errorf("first train labels %v", got)
	}
	if got := test.Labels[:5]; string(got) != "\x07\x02\x01\x00\x04" {
		t.Errorf("first test labels %v", got)
	}
	var counts [10]int
	for _, l := range train.Labels {
		counts[l]++
	}
	if counts[1] != 6742 || counts[5] != 5421 {
		t.Errorf("label counts %v", counts)
	}
}
