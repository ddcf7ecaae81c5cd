package checkpoint

import (
	"bytes"
	"iter"
	"slices"
	"strings"
	"testing"
)

// partsOf yields data in parts of the given sizes (the rest in one).
func partsOf(data []float32, sizes ...int) iter.Seq[[]float32] {
	return func(yield func([]float32) bool) {
		rest := data
		for _, n := range sizes {
			if !yield(rest[:n]) {
				return
			}
			rest = rest[n:]
		}
		if len(rest) > 0 {
			yield(rest)
		}
	}
}

// A tensor given as parts is written byte for byte as the same tensor
// given as one slice, whatever the parts' sizes (more than a chunk too).
func TestTensorOfPartsWritesTheSameBytes(t *testing.T) {
	data := make([]float32, chunkSize/4*2+37)
	for i := range data {
		data[i] = float32(i)*0.5 - 3
	}
	keys := []uint64{1, 5, 9}
	whole := []Tensor{{Name: "a", Shape: []int{len(data)}, Data: data}, {Name: "k", Shape: []int{3}, DType: U64, U64: keys}}
	want := encodeSafetensors(t, whole, nil)
	for _, sizes := range [][]int{nil, {1}, {16, 16, 3}, {chunkSize/4 - 1, 2, chunkSize / 4}} {
		parts := []Tensor{{Name: "a", Shape: []int{len(data)}, Parts: partsOf(data, sizes...), Elems: len(data)}, whole[1]}
		header, err := buildHeader(parts, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, native := range []bool{true, false} { // the native path only on little-endian hosts
			if native && !hostLittleEndian() {
				continue
			}
			var got bytes.Buffer
			if _, err := writeWithHeader(&got, header, parts, native); err != nil || !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("parts of sizes %v, native %v: the file differs from the one of the whole slice (%v)", sizes, native, err)
			}
		}
		back, _, err := ReadSafetensors(bytes.NewReader(want), int64(len(want)))
		if err != nil || !slices.Equal(back[0].Data, data) {
			t.Fatalf("read back: %v", err)
		}
	}
}

// Parts holding another count of elements than the tensor's fail the
// write instead of writing a file whose offsets lie.
func TestTensorOfPartsRefusesAWrongCount(t *testing.T) {
	data := []float32{1, 2, 3, 4}
	for _, n := range []int{3, 5} {
		tensors := []Tensor{{Name: "a", Shape: []int{n}, Parts: partsOf(data, 2), Elems: n}}
		var buf bytes.Buffer
		_, err := WriteSafetensors(&buf, tensors, nil)
		if err == nil || !strings.Contains(err.Error(), "elements") {
			t.Fatalf("%d elements declared, 4 given: err %v", n, err)
		}
	}
}
