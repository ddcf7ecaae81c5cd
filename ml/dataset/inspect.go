package dataset

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// Shape is what a data set's files say about it (Inspect).
type Shape struct {
	TrainN, TestN int // samples (mnist-x4: four per training image)
	Dim           int // pixels per image
	Classes       int // one more than the largest label, as Load gives
}

// Inspect checks the four files of the data set called name in dir
// without loading the images, so that a cluster can refuse to start on
// data its tasks could not load: each file must exist, have a valid IDX
// header (magic, element type, rank 3 for images and 1 for labels) and be
// exactly as long as its header declares; images and labels must agree
// in count, and training and test images in size. It reads the labels
// (for the number of classes) and, for a gzip-compressed file, the
// decompressed stream; of an uncompressed image file only the header.
// Malformed files give errors wrapping ErrCorrupt that name the file.
// It does not check the published MD5 sums of mnist and fashion-mnist
// (Fetch and Load do).
func Inspect(dir, name string) (Shape, error) {
	paths, per, err := dataPaths(dir, name)
	if err != nil {
		return Shape{}, err
	}
	var dims [4][]int
	var maxLabel [4]int
	for i, p := range paths {
		if dims[i], maxLabel[i], err = inspectIDX(p, i%2 == 1); err != nil {
			return Shape{}, err
		}
	}
	var sh Shape
	for set, n := range []*int{&sh.TrainN, &sh.TestN} {
		img, lab := dims[2*set], dims[2*set+1]
		if len(img) != 3 || len(lab) != 1 {
			return Shape{}, fmt.Errorf("data: %s has dims %v and %s dims %v; want images [N, rows, cols] and labels [N]: %w",
				paths[2*set], img, paths[2*set+1], lab, ErrCorrupt)
		}
		if img[0] != lab[0] {
			return Shape{}, fmt.Errorf("data: %s holds %d images but %s %d labels: %w", paths[2*set], img[0], paths[2*set+1], lab[0], ErrCorrupt)
		}
		*n = img[0]
	}
	sh.TrainN *= per
	sh.Dim = dims[0][1] * dims[0][2]
	if d := dims[2][1] * dims[2][2]; sh.TrainN > 0 && sh.TestN > 0 && d != sh.Dim {
		return Shape{}, fmt.Errorf("data: training images have %d pixels (%s) but test images %d (%s): %w", sh.Dim, paths[0], d, paths[2], ErrCorrupt)
	}
	sh.Classes = max(maxLabel[1], maxLabel[3]) + 1
	return sh, nil
}

// dataPaths locates the four files of data set name (train images, train
// labels, test images, test labels) and says how many training samples
// each training image makes.
func dataPaths(dir, name string) (paths [4]string, per int, err error) {
	var spec setSpec
	switch {
	case name == "mnist":
		spec = mnistSpec()
	case name == mnistX4Name:
		spec, per = mnistSpec(), len(X4Transforms())
	case name == fashionName:
		spec = fashionSpec()
	case strings.HasPrefix(name, idxPrefix):
		paths, err = idxPaths(dir, name)
		return paths, 1, err
	default:
		return paths, 0, unknownSet(name)
	}
	for i, f := range spec.files {
		if paths[i], err = locate(filepath.Join(dir, spec.subdir), f.name); err != nil {
			return paths, 0, missingError(dir, spec, f, err)
		}
	}
	return paths, max(per, 1), nil
}

// inspectIDX checks the IDX file at path (header, and a length exactly as
// declared) and returns its dimensions; for a labels file it also reads
// the labels and returns the largest (-1 if none).
func inspectIDX(path string, labels bool) (dims []int, maxLab int, err error) {
	r, gz, size, closeFn, err := openData(path)
	if err != nil {
		return nil, 0, err
	}
	defer closeFn()
	dims, _, body, err := readIDXHeader(r, gz)
	if err != nil {
		return nil, 0, fmt.Errorf("data: %s: %w", path, err)
	}
	if !gz {
		if got := size - (4 + 4*int64(len(dims))); got != body {
			return nil, 0, fmt.Errorf("data: %s: %w", path, sizeMismatch(dims, body, got))
		}
	}
	maxLab = -1
	if labels {
		data, err := readAtMost(r, body)
		if err != nil {
			return nil, 0, fmt.Errorf("data: %s: %w", path, maybeGzip(err, gz))
		}
		for _, l := range data {
			maxLab = max(maxLab, int(l))
		}
		if int64(len(data)) < body {
			return nil, 0, fmt.Errorf("data: %s: %w", path, sizeMismatch(dims, body, int64(len(data))))
		}
		body = 0
	} else if !gz {
		return dims, maxLab, nil
	}
	// A compressed file: count what is left of the stream (for labels,
	// nothing may be).
	n, err := io.Copy(io.Discard, io.LimitReader(r, body+1))
	if err != nil {
		return nil, 0, fmt.Errorf("data: %s: %w", path, maybeGzip(err, gz))
	}
	if n != body {
		return nil, 0, fmt.Errorf("data: %s: %w", path, sizeMismatch(dims, body, n))
	}
	return dims, maxLab, nil
}
