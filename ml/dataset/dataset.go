package dataset

import (
	"fmt"
	"math"

	"github.com/pstrain/pstrain/ml/vec"
)

// Samples is a data set as a Batcher reads it: n samples of dim values
// each. Sample writes sample i's dim values into x[:dim] and returns its
// label; it must not keep x, and concurrent calls must be safe (a
// Dataset and a TrainShard are read-only). Shape is constant.
type Samples interface {
	Shape() (n, dim int)
	Sample(i int, x []float32) (label uint8)
}

// Dataset is an in-memory image classification data set.
//
// Its images are held either as float32 values (Images) or as stored,
// one byte per pixel (Pixels, four times smaller), converted a sample at
// a time by Sample; exactly one of the two is set when N > 0.
//
// A Dataset is not modified by any method of this package, so one value may
// be read by many goroutines at once. Datasets returned by Shard share their
// backing arrays with the receiver.
type Dataset struct {
	// Images holds N*Dim pixel values, sample after sample (row-major
	// [N, Dim]; within a sample the IDX row-major [rows, cols] order),
	// each scaled to [0, 1] as float32(byte) / 255; nil when Pixels holds
	// the images.
	Images []float32
	// Pixels holds the images as stored instead: N*Dim bytes in the same
	// order, pixel b meaning float32(b) / 255; nil when Images holds them.
	Pixels []uint8
	// Labels holds N class labels.
	Labels []uint8
	// N is the number of samples, Dim the number of values per sample
	// (rows*cols), Classes the number of classes: one more than the largest
	// label (see Load for how train and test sets agree on it).
	N, Dim, Classes int
}

// NewDataset builds a Dataset from a rank-3 image IDX ([N, rows, cols]) and a
// rank-1 label IDX ([N]). Pixels are scaled to float32(byte)/255; Classes is
// one more than the largest label (0 for an empty set). The error wraps
// ErrCorrupt if the ranks are wrong, an image has no pixels, or the counts of
// images and labels differ.
func NewDataset(images, labels *IDX) (*Dataset, error) {
	ds, err := checkPair(images, labels)
	if err != nil {
		return nil, err
	}
	ds.Images = scalePixels(images.Data)
	return ds, nil
}

// checkPair validates an image and a label IDX as NewDataset does and
// returns the Dataset they make, without its images.
func checkPair(images, labels *IDX) (*Dataset, error) {
	ds, err := pairShape(images.Dims, labels)
	if err != nil {
		return nil, err
	}
	if len(images.Data) != ds.N*ds.Dim {
		return nil, fmt.Errorf("data: IDX data length does not match its dims: %w", ErrCorrupt)
	}
	return ds, nil
}

// pairShape is checkPair on the images' dimensions alone (their header):
// the Dataset's labels, N, Dim and Classes.
func pairShape(imageDims []int, labels *IDX) (*Dataset, error) {
	if len(imageDims) != 3 {
		return nil, fmt.Errorf("data: images must have rank 3 [N, rows, cols], got dims %v: %w", imageDims, ErrCorrupt)
	}
	if len(labels.Dims) != 1 {
		return nil, fmt.Errorf("data: labels must have rank 1 [N], got dims %v: %w", labels.Dims, ErrCorrupt)
	}
	n, dim := imageDims[0], imageDims[1]*imageDims[2]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("data: %d images but %d labels: %w", n, labels.Dims[0], ErrCorrupt)
	}
	if dim == 0 && n > 0 {
		return nil, fmt.Errorf("data: images have no pixels (dims %v): %w", imageDims, ErrCorrupt)
	}
	if len(labels.Data) != n {
		return nil, fmt.Errorf("data: IDX data length does not match its dims: %w", ErrCorrupt)
	}
	ds := &Dataset{Labels: labels.Data, N: n, Dim: dim}
	ds.Classes = maxLabel(ds.Labels) + 1
	if n == 0 {
		ds.Classes = 0
	}
	return ds, nil
}

// newStoredDataset is NewDataset keeping the images as stored (Pixels).
func newStoredDataset(images, labels *IDX) (*Dataset, error) {
	ds, err := checkPair(images, labels)
	if err != nil {
		return nil, err
	}
	ds.Pixels = images.Data
	return ds, nil
}

// pixelScale maps a stored pixel b to float32(b)/255, the value the
// data sets hold (a table: one load per pixel instead of a division).
type pixelScale [256]float32

func newPixelScale() *pixelScale {
	var s pixelScale
	for i := range s {
		s[i] = float32(i) / 255
	}
	return &s
}

// scale writes the values of the stored pixels src into dst (vec.Pixels:
// the same values as the table, sixteen at a time with AVX2).
func (s *pixelScale) scale(dst []float32, src []uint8) { vec.Pixels(dst, src) }

// scalePixels converts bytes to float32(b)/255.
func scalePixels(b []byte) []float32 {
	out := make([]float32, len(b))
	newPixelScale().scale(out, b)
	return out
}

func maxLabel(labels []uint8) int {
	m := 0
	for _, l := range labels {
		if int(l) > m {
			m = int(l)
		}
	}
	return m
}

// Image returns the Dim pixel values of sample i (a sub-slice of Images;
// a Dataset held as Pixels has none: use Sample).
func (ds *Dataset) Image(i int) []float32 {
	return ds.Images[i*ds.Dim : (i+1)*ds.Dim : (i+1)*ds.Dim]
}

// Shape returns N and Dim (Samples).
func (ds *Dataset) Shape() (n, dim int) { return ds.N, ds.Dim }

// Sample writes the Dim values of sample i into x and returns its label
// (Samples). For a Dataset held as Pixels it converts the bytes.
func (ds *Dataset) Sample(i int, x []float32) uint8 {
	d := ds.Dim
	if ds.Pixels != nil {
		for j, b := range ds.Pixels[i*d : (i+1)*d] {
			x[j] = float32(b) / 255
		}
	} else {
		copy(x[:d], ds.Images[i*d:(i+1)*d])
	}
	return ds.Labels[i]
}

// Shard returns shard i of n: the contiguous range of samples
// [i*q + min(i, r), (i+1)*q + min(i+1, r)) where q = N/n and r = N%n, so the
// first r shards hold q+1 samples and the rest q. Together the n shards cover
// every sample exactly once, in order. The result shares the receiver's
// backing arrays (with capacity clipped, so appending to it cannot clobber a
// neighbour). Shard panics unless 0 <= i < n.
func (ds *Dataset) Shard(i, n int) *Dataset {
	lo, hi := shardRange(ds.N, i, n)
	out := &Dataset{
		Labels:  ds.Labels[lo:hi:hi],
		N:       hi - lo,
		Dim:     ds.Dim,
		Classes: ds.Classes,
	}
	if ds.Pixels != nil {
		out.Pixels = ds.Pixels[lo*ds.Dim : hi*ds.Dim : hi*ds.Dim]
	} else {
		out.Images = ds.Images[lo*ds.Dim : hi*ds.Dim : hi*ds.Dim]
	}
	return out
}

// shardRange is the range of samples [lo, hi) of shard i of n of a set
// of size samples (see Dataset.Shard). It panics unless 0 <= i < n.
func shardRange(size, i, n int) (lo, hi int) {
	if n <= 0 || i < 0 || i >= n {
		panic(fmt.Sprintf("data: Shard(%d, %d): need 0 <= i < n", i, n))
	}
	q, r := size/n, size%n
	lo = i*q + min(i, r)
	hi = lo + q
	if i < r {
		hi++
	}
	return lo, hi
}

// SubsetSize is the number of samples Subset(fraction, seed) keeps from a set
// of n samples: ceil(fraction*n), computed with a tolerance of 1e-9 against
// floating-point error (so 0.07*100 is 7, not 8), and at least 1 when n > 0.
// It panics unless 0 < fraction <= 1.
func SubsetSize(fraction float64, n int) int {
	if !(fraction > 0 && fraction <= 1) {
		panic(fmt.Sprintf("data: subset fraction %v not in (0, 1]", fraction))
	}
	k := int(math.Ceil(fraction*float64(n) - 1e-9))
	return min(max(k, min(n, 1)), n)
}

// Subset returns a copy of the first SubsetSize(fraction, N) samples of the
// data set in the order given by Permutation(N, seed): sample j of the result
// is sample Permutation(N, seed)[j] of the receiver. The result is a fresh
// copy and is fully determined by (data set, fraction, seed); fraction 1
// yields a shuffled copy of the whole set. It panics unless 0 < fraction <= 1.
func (ds *Dataset) Subset(fraction float64, seed int64) *Dataset {
	k := SubsetSize(fraction, ds.N)
	perm := Permutation(ds.N, seed)[:k]
	d := ds.Dim
	out := &Dataset{
		Labels:  make([]uint8, k),
		N:       k,
		Dim:     d,
		Classes: ds.Classes,
	}
	if ds.Pixels != nil {
		out.Pixels = make([]uint8, k*d)
		for j, src := range perm {
			copy(out.Pixels[j*d:(j+1)*d], ds.Pixels[src*d:(src+1)*d])
		}
	} else {
		out.Images = make([]float32, k*d)
		for j, src := range perm {
			copy(out.Images[j*d:(j+1)*d], ds.Images[src*d:(src+1)*d])
		}
	}
	for j, src := range perm {
		out.Labels[j] = ds.Labels[src]
	}
	return out
}
