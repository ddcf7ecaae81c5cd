//go:build amd64 && !purego

package conv

import (
	"testing"

	"golang.org/x/sys/cpu"
)

// The assembly runs wherever the CPU has AVX2 and FMA: a wrong check
// would send the CNN's first block back to im2col with every other test
// passing.
func TestFastWhereTheCPUCan(t *testing.T) {
	want := cpu.X86.HasAVX2 && cpu.X86.HasFMA
	if got := Fast(16); got != want {
		t.Fatalf("Fast(16) = %t on a CPU with AVX2 %t and FMA %t", got, cpu.X86.HasAVX2, cpu.X86.HasFMA)
	}
	if Fast(8) || Fast(24) {
		t.Fatal("Fast takes a channel count that is not a multiple of 16")
	}
}
