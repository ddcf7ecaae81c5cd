package dataset

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// TrainSet is a data set's training set on disk, opened without reading
// its images: what a worker needs to build its model (Dim, Classes) and
// to read its shard (TrainSet.Shard). Its samples, their order and their
// values are Load's: sample i of Load's training set is sample i here.
//
// A TrainSet holds the training labels (one byte per image) and nothing
// else of the data; it is read-only after OpenTrainSet.
type TrainSet struct {
	// N is the number of training samples (mnist-x4: four per stored
	// image), Dim the number of values per sample, Classes the number of
	// classes as Load gives it (over the training and the test labels).
	N, Dim, Classes int

	images string      // the training images file
	labels []uint8     // the training labels, one per stored image
	copies []Transform // mnist-x4: image i is samples len(copies)*i+k, under copies[k]; nil: one sample per image
	side   int         // the images' side when copies is set
}

// OpenTrainSet opens the training set of the data set called name (the
// names Load takes). Data sets with published MD5 sums are checked as Load
// checks them, all four files, hashed as they stream by (the memory used
// does not grow with the files); "idx:" sets are checked for consistent
// headers and lengths. It reads the headers, the training labels and the
// test labels (Classes is over both), not the images.
func OpenTrainSet(dir, name string) (*TrainSet, error) {
	switch {
	case name == "mnist":
		return openVerifiedTrain(dir, mnistSpec(), nil)
	case name == mnistX4Name:
		return openVerifiedTrain(dir, mnistSpec(), X4Transforms())
	case name == fashionName:
		return openVerifiedTrain(dir, fashionSpec(), nil)
	case strings.HasPrefix(name, idxPrefix):
		paths, err := idxPaths(dir, name)
		if err != nil {
			return nil, err
		}
		return openTrain(paths, nil)
	}
	return nil, unknownSet(name)
}

// openVerifiedTrain checks spec's files in dir against their sums and opens
// the training set they hold.
func openVerifiedTrain(dir string, spec setSpec, copies []Transform) (*TrainSet, error) {
	var paths [4]string
	for i, f := range spec.files {
		path, err := locate(filepath.Join(dir, spec.subdir), f.name)
		if err != nil {
			return nil, missingError(dir, spec, f, err)
		}
		if err := checkSum(path, f); err != nil {
			return nil, refetchHint(err, dir, spec)
		}
		paths[i] = path
	}
	ts, err := openTrain(paths, copies)
	if err != nil {
		return nil, refetchHint(err, dir, spec)
	}
	return ts, nil
}

// openTrain reads what a TrainSet holds from the four files (train
// images, train labels, test images, test labels) and checks that they
// agree as Load checks them.
func openTrain(paths [4]string, copies []Transform) (*TrainSet, error) {
	train, err := labelledImages(paths[0], paths[1])
	if err != nil {
		return nil, err
	}
	test, err := labelledImages(paths[2], paths[3])
	if err != nil {
		return nil, err
	}
	if train.N > 0 && test.N > 0 && train.Dim != test.Dim {
		return nil, fmt.Errorf("data: training images have %d pixels (%s) but test images %d (%s): %w",
			train.Dim, paths[0], test.Dim, paths[2], ErrCorrupt)
	}
	ts := &TrainSet{N: train.N, Dim: train.Dim, Classes: max(train.Classes, test.Classes), images: paths[0], labels: train.Labels}
	if len(copies) > 0 {
		ts.side = isqrt(ts.Dim)
		if ts.side*ts.side != ts.Dim {
			return nil, fmt.Errorf("data: augment: images of %d pixels are not square", ts.Dim)
		}
		ts.copies, ts.N = copies, train.N*len(copies)
	}
	return ts, nil
}

// labelledImages reads an image file's header and its label file, checks
// them as NewDataset does, and returns the Dataset they make without its
// images.
func labelledImages(imagesPath, labelsPath string) (*Dataset, error) {
	lbl, err := ReadIDXFile(labelsPath)
	if err != nil {
		return nil, err
	}
	dims, err := readIDXDims(imagesPath)
	if err != nil {
		return nil, err
	}
	ds, err := pairShape(dims, lbl)
	if err != nil {
		return nil, fmt.Errorf("data: %s + %s: %w", imagesPath, labelsPath, err)
	}
	return ds, nil
}

// ShardSpec says which part of a training set a worker trains on.
type ShardSpec struct {
	// Index and Count: shard Index of Count (Dataset.Shard's split).
	Index, Count int
	// Fraction in (0, 1]: below 1 the split is of Subset(Fraction, Seed)
	// of the training set (the run's --data-fraction), else of the whole
	// set in order.
	Fraction float64
	Seed     int64
}

// Shard reads the samples of shard s: exactly those, in that order and
// with those values, that Load's training set gives with
// train.Shard(s.Index, s.Count), or train.Subset(s.Fraction,
// s.Seed).Shard(s.Index, s.Count) when s.Fraction < 1. Only the images
// the shard uses are read (readIDXRows) and held, as stored; mnist-x4's
// copies are made when a sample is read. A worker whose shard changed
// calls Shard again. The error wraps ErrCorrupt for a damaged file.
func (t *TrainSet) Shard(s ShardSpec) (*TrainShard, error) {
	if s.Count <= 0 || s.Index < 0 || s.Index >= s.Count {
		return nil, fmt.Errorf("data: shard %d of %d: need 0 <= index < count", s.Index, s.Count)
	}
	if !(s.Fraction > 0 && s.Fraction <= 1) {
		return nil, fmt.Errorf("data: shard: fraction %v not in (0, 1]", s.Fraction)
	}
	samples := t.shardSamples(s)
	per := max(1, len(t.copies))
	rows := make([]int, len(samples))
	for i, v := range samples {
		rows[i] = v / per
	}
	slices.Sort(rows)
	rows = slices.Compact(rows)
	dims, pixels, err := readIDXRows(t.images, rows)
	if err != nil {
		return nil, err
	}
	if len(dims) != 3 || dims[0] != len(t.labels) || dims[1]*dims[2] != t.Dim {
		return nil, fmt.Errorf("data: %s changed since it was opened (dims %v): %w", t.images, dims, ErrCorrupt)
	}
	sh := &TrainShard{N: len(samples), Dim: t.Dim, Classes: t.Classes, pixels: pixels,
		row: make([]int32, len(samples)), labels: make([]uint8, len(samples)), scale: newPixelScale()}
	if t.copies != nil {
		sh.copyOf = make([]uint8, len(samples))
		for _, c := range t.copies {
			sh.maps = append(sh.maps, c.sampler(t.side))
		}
	}
	for i, v := range samples {
		img := v / per
		r, _ := slices.BinarySearch(rows, img)
		sh.row[i], sh.labels[i] = int32(r), t.labels[img]
		if sh.copyOf != nil {
			sh.copyOf[i] = uint8(v % per)
		}
	}
	return sh, nil
}

// shardSamples lists the training samples of shard s, in the shard's order.
func (t *TrainSet) shardSamples(s ShardSpec) []int {
	if s.Fraction < 1 {
		k := SubsetSize(s.Fraction, t.N)
		lo, hi := shardRange(k, s.Index, s.Count)
		return Permutation(t.N, s.Seed)[lo:hi:hi]
	}
	lo, hi := shardRange(t.N, s.Index, s.Count)
	out := make([]int, hi-lo)
	for i := range out {
		out[i] = lo + i
	}
	return out
}

// TrainShard is a worker's data shard, read by TrainSet.Shard: its images
// as stored, one byte per pixel, each sample converted to float32 values
// when it is read (Sample), into the caller's buffer. It holds a quarter
// of the bytes the same samples take as float32 (mnist-x4: a sixteenth,
// its copies being made on the fly). It is read-only: safe for
// concurrent use.
type TrainShard struct {
	// N is the number of samples, Dim the values per sample, Classes the
	// training set's.
	N, Dim, Classes int

	pixels []uint8     // the images the shard uses, Dim bytes each, in file order
	row    []int32     // sample i is image row[i] of pixels
	copyOf []uint8     // mnist-x4: sample i is made by maps[copyOf[i]]; nil: the image itself
	labels []uint8     // sample i's label
	maps   []pixelMap  // mnist-x4: one per copy
	scale  *pixelScale // stored byte -> value
}

// Shape returns N and Dim (Samples).
func (s *TrainShard) Shape() (n, dim int) { return s.N, s.Dim }

// Sample writes the Dim values of sample i into x and returns its label
// (Samples).
func (s *TrainShard) Sample(i int, x []float32) uint8 {
	d := s.Dim
	r := int(s.row[i])
	img := s.pixels[r*d : (r+1)*d]
	if s.copyOf != nil {
		s.maps[s.copyOf[i]].applyBytes(img, s.scale, x[:d])
	} else {
		s.scale.scale(x[:d], img)
	}
	return s.labels[i]
}

// HeldBytes is the memory the shard's data takes: its images, labels and
// index.
func (s *TrainShard) HeldBytes() int {
	return len(s.pixels) + len(s.labels) + 4*len(s.row) + len(s.copyOf)
}
