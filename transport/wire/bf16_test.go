package wire

import (
	"math"
	"testing"
)

func TestBF16Rounding(t *testing.T) {
	inf := float32(math.Inf(1))
	for _, c := range []struct {
		in   float32
		want float32
	}{
		{0, 0},
		{1, 1},
		{-2.5, -2.5},
		{3.140625, 3.140625}, // exactly representable
		// 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even
		// mantissa (1); 1 + 3*2^-8 is halfway between 1 + 2^-7 and
		// 1 + 2^-6: to 1 + 2^-6.
		{1 + 1.0/256, 1},
		{1 + 3.0/256, 1 + 1.0/64},
		{1 + 1.0/256 + 1.0/65536, 1 + 1.0/128}, // above halfway: up
		{math.MaxFloat32, inf},                 // beyond bfloat16's largest finite value
		{inf, inf},
		{-inf, -inf},
		{1e-40, math.Float32frombits(math.Float32bits(1e-40) &^ 0xffff)}, // subnormal, exact after truncation here
	} {
		if got := FromBF16(BF16(c.in)); got != c.want {
			t.Errorf("bf16(%g) = %g, want %g", c.in, got, c.want)
		}
	}
	for _, nan := range []float32{float32(math.NaN()), math.Float32frombits(0x7f800001), math.Float32frombits(0xff80ffff)} {
		if got := FromBF16(BF16(nan)); !math.IsNaN(float64(got)) {
			t.Errorf("bf16(NaN %#x) = %g, want NaN", math.Float32bits(nan), got)
		}
	}
}

func TestBF16Slices(t *testing.T) {
	src := []float32{1, -0.5, 1e10, -3.75}
	b := make([]byte, 2*len(src))
	PutBF16(b, src)
	got := make([]float32, len(src))
	if err := DecodeBF16(got, b); err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if got[i] != FromBF16(BF16(src[i])) {
			t.Errorf("value %d: %g, want %g", i, got[i], FromBF16(BF16(src[i])))
		}
	}
	// Bytes at an odd address (a sub-slice of a message) take the slow
	// path, with the same result.
	odd := make([]byte, len(b)+1)
	copy(odd[1:], b)
	got2 := make([]float32, len(src))
	if err := DecodeBF16(got2, odd[1:]); err != nil {
		t.Fatal(err)
	}
	PutBF16(odd[1:], src)
	for i := range got {
		if got2[i] != got[i] || odd[1+2*i] != b[2*i] || odd[2+2*i] != b[2*i+1] {
			t.Fatalf("value %d differs through an odd address", i)
		}
	}
	if err := DecodeBF16(got, b[:7]); err == nil {
		t.Error("an odd number of bytes was accepted")
	}
	if err := DecodeBF16(got[:3], b); err == nil {
		t.Error("a length mismatch was accepted")
	}
}
