//go:build cgo && !purego

package blas

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
void openblas_set_num_threads(int);
*/
import "C"

import (
	"unsafe"

	gblas "gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"
)

// Name says which BLAS this binary uses.
const Name = "openblas"

// Impl is gonum's implementation with Sgemm replaced by OpenBLAS.
type Impl struct{ gonum.Implementation }

func trans(t gblas.Transpose) C.enum_CBLAS_TRANSPOSE {
	if t == gblas.NoTrans {
		return C.CblasNoTrans
	}
	return C.CblasTrans
}

// Sgemm computes C = alpha*op(A)*op(B) + beta*C in row-major order.
func (Impl) Sgemm(tA, tB gblas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	if m == 0 || n == 0 {
		return
	}
	var pa, pb *C.float
	if len(a) > 0 {
		pa = (*C.float)(unsafe.Pointer(&a[0]))
	}
	if len(b) > 0 {
		pb = (*C.float)(unsafe.Pointer(&b[0]))
	}
	C.cblas_sgemm(C.CblasRowMajor, trans(tA), trans(tB), C.blasint(m), C.blasint(n), C.blasint(k),
		C.float(alpha), pa, C.blasint(lda), pb, C.blasint(ldb), C.float(beta),
		(*C.float)(unsafe.Pointer(&c[0])), C.blasint(ldc))
}

// Setup makes gorgonia use OpenBLAS with the given number of threads
// (<= 0 means 1).
func Setup(threads int) {
	if threads <= 0 {
		threads = 1
	}
	C.openblas_set_num_threads(C.int(threads))
	gorgonia.Use(Impl{})
}
