package dataset

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sameSamples reports whether a and b hold the same samples: shapes,
// labels and every value bit for bit.
func sameSamples(a, b Samples) bool {
	n, d := a.Shape()
	if m, e := b.Shape(); m != n || e != d {
		return false
	}
	x, y := make([]float32, d), make([]float32, d)
	for i := 0; i < n; i++ {
		if a.Sample(i, x) != b.Sample(i, y) {
			return false
		}
		for j := range x {
			if math.Float32bits(x[j]) != math.Float32bits(y[j]) {
				return false
			}
		}
	}
	return true
}

// squareSet is a training and a test set of side x side images with
// varied pixels (so resampling has something to resample), as IDX files.
func squareSet(n, nTest, side, classes int) [4][]byte {
	img := func(n, salt int) []byte {
		body := make([]byte, n*side*side)
		for i := range body {
			body[i] = byte((i*37 + salt) % 251)
		}
		return idxBytes([]uint32{uint32(n), uint32(side), uint32(side)}, body)
	}
	return [4][]byte{img(n, 0), synthLabels(n, classes), img(nTest, 11), synthLabels(nTest, classes-1)}
}

// writeSet writes files as an "idx:" data set in dir (each file
// gzip-compressed where gz says) and returns its name.
func writeSet(t *testing.T, dir string, files [4][]byte, gz [4]bool) string {
	t.Helper()
	var names []string
	for i, b := range files {
		name := fmt.Sprintf("f%d", i)
		if gz[i] {
			name += ".gz"
			b = gzipBytes(t, b)
		}
		writeFile(t, dir, name, b)
		names = append(names, name)
	}
	return idxPrefix + strings.Join(names, ",")
}

// The worker's shard, read on its own, is exactly the shard of Load's
// training set: same samples, same order, same values, for every shard
// count and data fraction, plain or gzip-compressed files.
func TestTrainShardMatchesLoad(t *testing.T) {
	files := squareSet(53, 9, 5, 7)
	for _, gz := range [][4]bool{{}, {true, true, true, true}} {
		dir := t.TempDir()
		name := writeSet(t, dir, files, gz)
		train, test, err := Load(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		ts, err := OpenTrainSet(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		if ts.N != train.N || ts.Dim != train.Dim || ts.Classes != train.Classes || ts.Classes != test.Classes {
			t.Fatalf("gz %v: TrainSet N %d Dim %d Classes %d; Load: %d %d %d", gz, ts.N, ts.Dim, ts.Classes, train.N, train.Dim, train.Classes)
		}
		for _, f := range []float64{1, 0.37} {
			for _, count := range []int{1, 2, 3, 7} {
				whole := train
				if f < 1 {
					whole = train.Subset(f, 5)
				}
				for i := 0; i < count; i++ {
					want := whole.Shard(i, count)
					got, err := ts.Shard(ShardSpec{Index: i, Count: count, Fraction: f, Seed: 5})
					if err != nil {
						t.Fatal(err)
					}
					if !sameSamples(got, want) || got.Classes != want.Classes {
						t.Fatalf("gz %v fraction %v: shard %d of %d differs from Load's", gz, f, i, count)
					}
					if f == 1 && got.HeldBytes() != want.N*(want.Dim+1+4) {
						t.Errorf("shard %d of %d holds %d bytes, want only its %d images, labels and index", i, count, got.HeldBytes(), want.N)
					}
				}
			}
		}
	}
}

// mnist-x4's copies are made when a sample is read, with exactly the
// values Load's Augment computes.
func TestTrainShardX4MatchesAugment(t *testing.T) {
	files := squareSet(31, 4, 9, 10)
	dir := t.TempDir()
	name := writeSet(t, dir, files, [4]bool{})
	train, _, err := Load(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	x4, err := Augment(train, X4Transforms())
	if err != nil {
		t.Fatal(err)
	}
	paths, _ := idxPaths(dir, name)
	ts, err := openTrain(paths, X4Transforms())
	if err != nil {
		t.Fatal(err)
	}
	if ts.N != x4.N || ts.Classes != x4.Classes {
		t.Fatalf("x4 TrainSet N %d Classes %d, Augment %d %d", ts.N, ts.Classes, x4.N, x4.Classes)
	}
	for _, f := range []float64{1, 0.3} {
		whole := x4
		if f < 1 {
			whole = x4.Subset(f, 9)
		}
		for _, count := range []int{1, 3, 5} {
			for i := 0; i < count; i++ {
				got, err := ts.Shard(ShardSpec{Index: i, Count: count, Fraction: f, Seed: 9})
				if err != nil {
					t.Fatal(err)
				}
				if !sameSamples(got, whole.Shard(i, count)) {
					t.Fatalf("fraction %v: x4 shard %d of %d differs from Augment's", f, i, count)
				}
				if f == 1 && len(got.pixels) > (got.N/4+2)*got.Dim {
					t.Errorf("x4 shard of %d samples holds %d images", got.N, len(got.pixels)/got.Dim)
				}
			}
		}
	}
}

// A worker's stream of batches (the order, by data position, that exactly
// once rests on) is the same over its TrainShard as over Load's shard.
func TestTrainShardBatchesMatch(t *testing.T) {
	dir := t.TempDir()
	name := writeSet(t, dir, squareSet(61, 3, 4, 5), [4]bool{})
	train, _, err := Load(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := OpenTrainSet(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	const B, seed = 4, 3
	sh, err := ts.Shard(ShardSpec{Index: 1, Count: 2, Fraction: 1})
	if err != nil {
		t.Fatal(err)
	}
	a := NewFullBatches(NewBatcher(sh, B, seed+1))
	b := NewFullBatches(NewBatcher(train.Shard(1, 2), B, seed+1))
	xa, xb := make([]float32, B*ts.Dim), make([]float32, B*ts.Dim)
	ya, yb := make([]uint8, B), make([]uint8, B)
	for p := int64(0); p < 40; p++ {
		if p == 25 { // a restarted worker seeks back
			a.SeekBatch(9)
			b.SeekBatch(9)
		}
		a.Next(xa, ya)
		b.Next(xb, yb)
		if !equalF32(xa, xb) || string(ya) != string(yb) {
			t.Fatalf("batch %d differs", a.Position()-1)
		}
	}
}

func TestTrainShardRejects(t *testing.T) {
	dir := t.TempDir()
	ts, err := OpenTrainSet(dir, writeSet(t, dir, squareSet(10, 3, 4, 5), [4]bool{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []ShardSpec{{Index: 2, Count: 2, Fraction: 1}, {Index: 0, Count: 0, Fraction: 1},
		{Index: -1, Count: 2, Fraction: 1}, {Index: 0, Count: 1, Fraction: 0}, {Index: 0, Count: 1, Fraction: 1.5}} {
		if _, err := ts.Shard(s); err == nil {
			t.Errorf("Shard(%+v) accepted", s)
		}
	}
	if _, err := OpenTrainSet(dir, "cifar"); err == nil || !strings.Contains(err.Error(), "unknown data set") {
		t.Errorf("unknown set: %v", err)
	}
}

// Damaged files are errors wrapping ErrCorrupt, found when the set is
// opened (a plain file's length is checked against its header) or, for
// a compressed images file that cannot be checked without reading it
// all, when the shard is read.
func TestTrainSetCorruptFiles(t *testing.T) {
	good := squareSet(12, 3, 4, 5)
	short := func(b []byte) []byte { return b[:len(b)-3] }
	long := func(b []byte) []byte { return append(append([]byte{}, b...), 1, 2) }
	cases := []struct {
		name   string
		file   int
		edit   func([]byte) []byte
		gz     bool
		atOpen bool
	}{
		{"truncated images", 0, short, false, true},
		{"images with trailing bytes", 0, long, false, true},
		{"truncated test images", 2, short, false, true},
		{"truncated labels", 1, short, false, true},
		{"truncated gzip images", 0, short, true, false},
		{"gzip images with trailing bytes", 0, long, true, false},
		{"labels as images", 0, func([]byte) []byte { return good[1] }, false, true},
	}
	for _, c := range cases {
		files := good
		files[c.file] = c.edit(good[c.file])
		var gz [4]bool
		gz[c.file] = c.gz
		dir := t.TempDir()
		ts, err := OpenTrainSet(dir, writeSet(t, dir, files, gz))
		if err == nil {
			_, err = ts.Shard(ShardSpec{Index: 1, Count: 2, Fraction: 1})
			if c.atOpen {
				t.Errorf("%s: opened", c.name)
			}
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", c.name, err)
		}
	}
}

// Sets with published sums are checked before use, as Load checks them.
func TestOpenTrainSetVerifies(t *testing.T) {
	s := newSynthSet()
	dir := t.TempDir()
	writeSynth(t, dir, s, [4]bool{false, true, false, false})
	ts, err := openVerifiedTrain(dir, s.spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	train, _, err := loadVerified(dir, s.spec)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := ts.Shard(ShardSpec{Index: 0, Count: 3, Fraction: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !sameSamples(sh, train.Shard(0, 3)) || ts.Classes != 4 {
		t.Fatalf("verified set's shard differs from Load's (classes %d)", ts.Classes)
	}

	bad := append([]byte{}, s.files[0]...)
	bad[30] ^= 1 // same size, different content
	writeFile(t, dir, s.spec.files[0].name, bad)
	if _, err := openVerifiedTrain(dir, s.spec, nil); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "pstrain data fetch") {
		t.Errorf("changed images: err = %v, want ErrChecksum and the fetch command", err)
	}
	os.Remove(filepath.Join(dir, s.spec.files[0].name))
	if _, err := openVerifiedTrain(dir, s.spec, nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing images: err = %v, want fs.ErrNotExist", err)
	}
}

// readIDXRows keeps the rows asked for, in order, from plain and
// compressed files, and refuses rows out of order or out of range.
func TestReadIDXRows(t *testing.T) {
	file := synthImages(20, 2, 3)
	for _, gz := range []bool{false, true} {
		dir := t.TempDir()
		b := file
		if gz {
			b = gzipBytes(t, file)
		}
		p := writeFile(t, dir, "img", b)
		rows := []int{0, 3, 4, 5, 11, 19}
		dims, data, err := readIDXRows(p, rows)
		if err != nil {
			t.Fatal(err)
		}
		if len(dims) != 3 || dims[0] != 20 || len(data) != len(rows)*6 {
			t.Fatalf("gz %v: dims %v, %d bytes", gz, dims, len(data))
		}
		for k, r := range rows {
			for q := 0; q < 6; q++ {
				if data[k*6+q] != byte(r*7+q*3) {
					t.Fatalf("gz %v: byte %d of row %d is %d, want %d", gz, q, r, data[k*6+q], byte(r*7+q*3))
				}
			}
		}
		for _, bad := range [][]int{{3, 2}, {1, 1}, {20}, {-1}} {
			if _, _, err := readIDXRows(p, bad); err == nil {
				t.Errorf("gz %v: rows %v accepted", gz, bad)
			}
		}
	}
}

// TestTrainShardRealMNIST checks a worker's shard of the real MNIST files
// (in ../../data when fetched) against Load's.
func TestTrainShardRealMNIST(t *testing.T) {
	dir, _ := filepath.Abs("../../data")
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte")); err != nil {
		t.Skip("MNIST not in ../data")
	}
	train, _, err := Load(dir, "mnist")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := OpenTrainSet(dir, "mnist")
	if err != nil {
		t.Fatal(err)
	}
	if ts.N != 60000 || ts.Dim != 784 || ts.Classes != 10 {
		t.Fatalf("TrainSet N %d Dim %d Classes %d", ts.N, ts.Dim, ts.Classes)
	}
	for _, f := range []float64{1, 0.3} {
		sh, err := ts.Shard(ShardSpec{Index: 1, Count: 2, Fraction: f, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		whole := train
		if f < 1 {
			whole = train.Subset(f, 1)
		}
		if !sameSamples(sh, whole.Shard(1, 2)) {
			t.Errorf("fraction %v: shard 1 of 2 differs from Load's", f)
		}
	}
	x4, err := OpenTrainSet(dir, "mnist-x4")
	if err != nil || x4.N != 240000 || x4.Classes != 10 {
		t.Fatalf("mnist-x4: N %d (%v)", x4.N, err)
	}
}
