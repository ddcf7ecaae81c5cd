package hashmix

import "testing"

// The first outputs of splitmix64 seeded with 0 (state += Golden, then
// Mix), as the algorithm's reference implementation gives them.
func TestMixIsSplitMix64(t *testing.T) {
	want := []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}
	var state uint64
	for i, w := range want {
		state += Golden
		if got := Mix(state); got != w {
			t.Fatalf("output %d = %#x, want %#x", i, got, w)
		}
	}
}
