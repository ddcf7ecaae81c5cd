package worker

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/ml/ctrdata"
)

// randomBatch is n samples of s, keys below 2^32 except those set wide.
func randomBatch(s ctrdata.Schema, n int, r *rand.Rand, wide map[int]uint64) *ctrdata.Batch {
	b := ctrdata.NewBatch(s, n)
	b.N = n
	for i := range n {
		b.Labels[i] = uint8(r.IntN(2))
	}
	for j := range b.Dense {
		b.Dense[j] = r.Float32()
	}
	for j := range b.Keys {
		b.Keys[j] = uint64(r.Uint32())
	}
	for j, k := range wide {
		b.Keys[j] = k
	}
	return b
}

// TestCTRSamplesHoldKeysCompactly: samples appended in chunks read back
// as EncodeCTR encodes them, in 32 bits a key while every key fits, and
// intact once one does not (Criteo's missing key, 2^64-1).
func TestCTRSamplesHoldKeysCompactly(t *testing.T) {
	s := ctrdata.Schema{Dense: 3, Cat: 4}
	r := rand.New(rand.NewPCG(1, 2))
	chunks := []*ctrdata.Batch{randomBatch(s, 5, r, nil), randomBatch(s, 4, r, nil), randomBatch(s, 3, r, map[int]uint64{6: ctrdata.MissingKey})}
	all := NewCTRSamplesCap(s, 12)
	for c, b := range chunks {
		if err := all.Append(b); err != nil {
			t.Fatal(err)
		}
		if c == 1 && all.HeldBytes() != 12*(1+4*3+4*4) {
			t.Errorf("32-bit keys: %d bytes held, want %d", all.HeldBytes(), 12*(1+4*3+4*4))
		}
	}
	if all.HeldBytes() != 12*(1+4*3+8*4) {
		t.Errorf("64-bit keys: %d bytes held, want %d", all.HeldBytes(), 12*(1+4*3+8*4))
	}
	w := CTRWidth(s)
	got, want := make([]float32, w), make([]float32, w)
	i := 0
	for _, b := range chunks {
		for j := range b.N {
			EncodeCTR(b, j, want)
			if l := all.Sample(i, got); l != b.Labels[j] || !slices.EqualFunc(got, want, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
				t.Fatalf("sample %d: label %d %v, want %d %v", i, l, got, b.Labels[j], want)
			}
			i++
		}
	}
	if err := all.Append(chunks[0]); err == nil {
		t.Error("appending beyond the room: no error")
	}
}
