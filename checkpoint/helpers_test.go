package checkpoint

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"testing"
)

// detTensors returns deterministic tensors whose contents depend on seed:
// a weight matrix, its bias and Adam state, plus a scalar and an empty
// tensor.
func detTensors(seed int, rows, cols int) []Tensor {
	fill := func(n, salt int) []float32 {
		d := make([]float32, n)
		x := uint32(seed*7919 + salt*104729 + 1)
		for i := range d {
			x = x*1664525 + 1013904223
			d[i] = float32(int32(x>>8)) / (1 << 23)
		}
		return d
	}
	return []Tensor{
		{Name: "layer0/w[0:392]", Shape: []int{rows, cols}, Data: fill(rows*cols, 1)},
		{Name: "layer0/w[0:392]/m", Shape: []int{rows, cols}, Data: fill(rows*cols, 2)},
		{Name: "layer0/b", Shape: []int{cols}, Data: fill(cols, 3)},
		{Name: "step_scalar", Shape: []int{}, Data: []float32{float32(seed)}},
		{Name: "empty", Shape: []int{0, 3}, Data: []float32{}},
	}
}

func tensorsEqual(t *testing.T, got, want []Tensor) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d tensors, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Name != w.Name {
			t.Fatalf("tensor %d: name %q, want %q", i, g.Name, w.Name)
		}
		if len(g.Shape) != len(w.Shape) {
			t.Fatalf("tensor %q: shape %v, want %v", w.Name, g.Shape, w.Shape)
		}
		for j := range w.Shape {
			if g.Shape[j] != w.Shape[j] {
				t.Fatalf("tensor %q: shape %v, want %v", w.Name, g.Shape, w.Shape)
			}
		}
		if g.isU64() != w.isU64() || !slices.Equal(g.U64, w.U64) {
			t.Fatalf("tensor %q: dtype %q %v, want %q %v", w.Name, g.DType, g.U64, w.DType, w.U64)
		}
		if len(g.Data) != len(w.Data) {
			t.Fatalf("tensor %q: %d elements, want %d", w.Name, len(g.Data), len(w.Data))
		}
		for j := range w.Data {
			if math.Float32bits(g.Data[j]) != math.Float32bits(w.Data[j]) {
				t.Fatalf("tensor %q: element %d = %v, want %v", w.Name, j, g.Data[j], w.Data[j])
			}
		}
	}
}

func encodeSafetensors(t testing.TB, tensors []Tensor, meta map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := WriteSafetensors(&buf, tensors, meta)
	if err != nil {
		t.Fatalf("WriteSafetensors: %v", err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteSafetensors returned %d, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

// rawSafetensors assembles a file from a literal header and data.
func rawSafetensors(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func readBytes(b []byte) ([]Tensor, map[string]string, error) {
	return ReadSafetensors(bytes.NewReader(b), int64(len(b)))
}
