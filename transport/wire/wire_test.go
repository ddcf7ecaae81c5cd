package wire

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestRoundTripIsLittleEndian(t *testing.T) {
	x := []float32{1.5, -2, float32(math.Inf(1)), 0}
	b := Bytes(x)
	if len(b) != 16 {
		t.Fatalf("len %d", len(b))
	}
	for i, v := range x {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])); got != v {
			t.Fatalf("elem %d encoded as %v", i, got)
		}
	}
	y, err := Floats(append([]byte(nil), b...))
	if err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if x[i] != y[i] {
			t.Fatalf("round trip %v -> %v", x, y)
		}
	}
	// A misaligned buffer is copied, not viewed.
	buf := make([]byte, 17)
	copy(buf[1:], b)
	z, err := Floats(buf[1:])
	if err != nil || z[0] != 1.5 || z[3] != 0 {
		t.Fatalf("misaligned: %v %v", z, err)
	}
	if _, err := Floats(make([]byte, 7)); err == nil {
		t.Fatal("7 bytes accepted")
	}
}

// A view writes the bytes it views; a misaligned or ragged buffer has
// none.
func TestViewWritesTheBytes(t *testing.T) {
	if !SharesMemory() {
		t.Skip("a big-endian host has no views")
	}
	buf := make([]byte, 17)
	x, ok := View(buf[:16])
	if !ok || len(x) != 4 {
		t.Fatalf("View of 16 aligned bytes: %v %v", x, ok)
	}
	x[2] = -2.5
	if got := math.Float32frombits(binary.LittleEndian.Uint32(buf[8:])); got != -2.5 {
		t.Fatalf("the bytes read %v after writing -2.5 through the view", got)
	}
	if _, ok := View(buf[1:]); ok {
		t.Error("a misaligned buffer viewed")
	}
	if _, ok := View(buf[:7]); ok {
		t.Error("7 bytes viewed")
	}
}
