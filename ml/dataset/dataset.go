package dataset

import (
	"fmt"
	"math"
)

// Dataset is an in-memory image classification data set.
//
// A Dataset is not modified by any method of this package, so one value may
// be read by many goroutines at once. Datasets returned by Shard share their
// backing arrays with the receiver.
type Dataset struct {
	// Images holds N*Dim pixel values, sample after sample (row-major
	// [N, Dim]; within a sample the IDX row-major [rows, cols] order),
	// each scaled to [0, 1] as float32(byte) / 255.
	Images []float32
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
	if len(images.Dims) != 3 {
		return nil, fmt.Errorf("data: images must have rank 3 [N, rows, cols], got dims %v: %w", images.Dims, ErrCorrupt)
	}
	if len(labels.Dims) != 1 {
		return nil, fmt.Errorf("data: labels must have rank 1 [N], got dims %v: %w", labels.Dims, ErrCorrupt)
	}
	n, dim := images.Dims[0], images.Dims[1]*images.Dims[2]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("data: %d images but %d labels: %w", n, labels.Dims[0], ErrCorrupt)
	}
	if dim == 0 && n > 0 {
		return nil, fmt.Errorf("data: images have no pixels (dims %v): %w", images.Dims, ErrCorrupt)
	}
	if len(images.Data) != n*dim || len(labels.Data) != n {
		return nil, fmt.Errorf("data: IDX data length does not match its dims: %w", ErrCorrupt)
	}
	ds := &Dataset{
		Images: scalePixels(images.Data),
		Labels: labels.Data,
		N:      n,
		Dim:    dim,
	}
	ds.Classes = maxLabel(ds.Labels) + 1
	if n == 0 {
		ds.Classes = 0
	}
	return ds, nil
}

// scalePixels converts bytes to float32(b)/255 with a lookup table.
func scalePixels(b []byte) []float32 {
	var lut [256]float32
	for i := range lut {
		lut[i] = float32(i) / 255
	}
	out := make([]float32, len(b))
	for i, v := range b {
		out[i] = lut[v]
	}
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

// Image returns the Dim pixel values of sample i (a sub-slice of Images).
func (ds *Dataset) Image(i int) []float32 {
	return ds.Images[i*ds.Dim : (i+1)*ds.Dim : (i+1)*ds.Dim]
}

// Shard returns shard i of n: the contiguous range of samples
// [i*q + min(i, r), (i+1)*q + min(i+1, r)) where q = N/n and r = N%n, so the
// first r shards hold q+1 samples and the rest q. Together the n shards cover
// every sample exactly once, in order. The result shares the receiver's
// backing arrays (with capacity clipped, so appending to it cannot clobber a
// neighbour). Shard panics unless 0 <= i < n.
func (ds *Dataset) Shard(i, n int) *Dataset {
	if n <= 0 || i < 0 || i >= n {
		panic(fmt.Sprintf("data: Shard(%d, %d): need 0 <= i < n", i, n))
	}
	q, r := ds.N/n, ds.N%n
	lo := i*q + min(i, r)
	hi := lo + q
	if i < r {
		hi++
	}
	return &Dataset{
		Images:  ds.Images[lo*ds.Dim : hi*ds.Dim : hi*ds.Dim],
		Labels:  ds.Labels[lo:hi:hi],
		N:       hi - lo,
		Dim:     ds.Dim,
		Classes: ds.Classes,
	}
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
	out := &Dataset{
		Images:  make([]float32, k*ds.Dim),
		Labels:  make([]uint8, k),
		N:       k,
		Dim:     ds.Dim,
		Classes: ds.Classes,
	}
	for j, src := range perm {
		copy(out.Images[j*ds.Dim:(j+1)*ds.Dim], ds.Images[src*ds.Dim:(src+1)*ds.Dim])
		out.Labels[j] = ds.Labels[src]
	}
	return out
}
