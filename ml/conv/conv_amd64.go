//go:build amd64 && !purego

package conv

import "golang.org/x/sys/cpu"

// vector is whether this CPU and OS run AVX2 and FMA (fixed when the
// program starts).
var vector = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// fast says whether the assembly takes c channels.
func fast(c int) bool { return vector && c%16 == 0 }

//go:noescape
func rowAVX2(in *float32, w int, wt, out *float32, n, c int)

//go:noescape
func gradAVX2(in *float32, w int, dOut, dwt *float32, n, c int)

// rowBulk is Row's first n positions, n a multiple of 4.
func rowBulk(in []float32, w int, wt, out []float32, n, c int) {
	rowAVX2(&in[0], w, &wt[0], &out[0], n, c)
}

func gradBulk(in []float32, w int, dOut, dwt []float32, n, c int) {
	gradAVX2(&in[0], w, &dOut[0], &dwt[0], n, c)
}
