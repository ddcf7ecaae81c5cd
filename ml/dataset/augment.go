package dataset

import (
	"fmt"
	"math"
)

// Transform is a deterministic geometric change of a square image: rotate
// by Degrees (counter-clockwise) about the centre, then shift by (DX, DY)
// pixels (right, down). Pixels are resampled bilinearly; what comes from
// outside the image is 0 (background).
type Transform struct {
	Degrees float64
	DX, DY  float64
}

// mnistX4Name is MNIST with four copies of the training set (Load makes
// them with X4Transforms; the test set is MNIST's).
const mnistX4Name = "mnist-x4"

// X4Transforms are the four copies of `mnist-x4`: the original, a shift,
// and two small rotations (one with a shift).
func X4Transforms() []Transform {
	return []Transform{
		{},
		{DX: 2, DY: 1},
		{Degrees: 10},
		{Degrees: -10, DX: -1, DY: -2},
	}
}

// Augment returns a data set with len(ts) copies of every sample of ds,
// interleaved: sample len(ts)*i+k is sample i under ts[k]. Images must be
// square. The result is fully determined by ds and ts.
func Augment(ds *Dataset, ts []Transform) (*Dataset, error) {
	side := isqrt(ds.Dim)
	if side*side != ds.Dim {
		return nil, fmt.Errorf("data: augment: images of %d pixels are not square", ds.Dim)
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("data: augment: no transforms")
	}
	k := len(ts)
	out := &Dataset{
		Images:  make([]float32, k*ds.N*ds.Dim),
		Labels:  make([]uint8, k*ds.N),
		N:       k * ds.N,
		Dim:     ds.Dim,
		Classes: ds.Classes,
	}
	for t, tr := range ts {
		m := tr.sampler(side)
		for i := 0; i < ds.N; i++ {
			j := k*i + t
			out.Labels[j] = ds.Labels[i]
			m.apply(ds.Image(i), out.Images[j*ds.Dim:(j+1)*ds.Dim])
		}
	}
	return out, nil
}

// pixelMap precomputes, for every destination pixel, the four source pixels
// and their bilinear weights (index -1: outside, contributes 0).
type pixelMap struct {
	src [][4]int
	w   [][4]float32
}

func (t Transform) sampler(side int) pixelMap {
	n := side * side
	m := pixelMap{src: make([][4]int, n), w: make([][4]float32, n)}
	c := float64(side-1) / 2
	sin, cos := math.Sincos(t.Degrees * math.Pi / 180)
	for y := 0; y < side; y++ {
		for x := 0; x < side; x++ {
			// Inverse map: undo the shift, then the rotation.
			u, v := float64(x)-t.DX-c, float64(y)-t.DY-c
			sx := cos*u - sin*v + c
			sy := sin*u + cos*v + c
			x0, y0 := math.Floor(sx), math.Floor(sy)
			fx, fy := sx-x0, sy-y0
			d := y*side + x
			for q, o := range [4][2]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}} {
				xi, yi := int(x0)+o[0], int(y0)+o[1]
				wx, wy := 1-fx, 1-fy
				if o[0] == 1 {
					wx = fx
				}
				if o[1] == 1 {
					wy = fy
				}
				m.src[d][q] = -1
				if xi >= 0 && xi < side && yi >= 0 && yi < side {
					m.src[d][q] = yi*side + xi
					m.w[d][q] = float32(wx * wy)
				}
			}
		}
	}
	return m
}

func (m pixelMap) apply(src, dst []float32) {
	for d := range dst {
		var v float32
		for q := 0; q < 4; q++ {
			if s := m.src[d][q]; s >= 0 {
				v += m.w[d][q] * src[s]
			}
		}
		dst[d] = min(max(v, 0), 1)
	}
}

// applyBytes is apply on stored pixels, scaled by s: the same values
// apply gives on the scaled image, without the scaled image.
func (m pixelMap) applyBytes(src []uint8, s *pixelScale, dst []float32) {
	for d := range dst {
		var v float32
		for q := 0; q < 4; q++ {
			if i := m.src[d][q]; i >= 0 {
				v += m.w[d][q] * s[src[i]]
			}
		}
		dst[d] = min(max(v, 0), 1)
	}
}
