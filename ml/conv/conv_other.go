//go:build !amd64 || purego

package conv

// fast is false: without the assembly, the Go loops take every position.
func fast(int) bool { return false }

func rowBulk([]float32, int, []float32, []float32, int, int) { panic("conv: no assembly") }

func gradBulk([]float32, int, []float32, []float32, int, int) { panic("conv: no assembly") }
