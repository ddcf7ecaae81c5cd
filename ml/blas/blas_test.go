package blas

import (
	"math"
	"os"
	"strings"
	"testing"

	gblas "gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"
)

// Setup's BLAS computes what gonum's reference does, for every transpose
// combination and with a non-zero beta, on shapes that are not square.
func TestSetupSgemmMatchesGonum(t *testing.T) {
	if err := Setup(1); err != nil {
		t.Fatal(err)
	}
	impl, ok := gorgonia.WhichBLAS().(gblas.Float32Level3)
	if !ok {
		t.Fatalf("gorgonia's BLAS %T has no Sgemm", gorgonia.WhichBLAS())
	}
	const m, n, k = 5, 3, 4
	fill := func(size int, seed float32) []float32 {
		x := make([]float32, size)
		for i := range x {
			x[i] = seed * float32((i*7)%11-5)
		}
		return x
	}
	for _, tA := range []gblas.Transpose{gblas.NoTrans, gblas.Trans} {
		for _, tB := range []gblas.Transpose{gblas.NoTrans, gblas.Trans} {
			lda, ldb := k, n
			if tA == gblas.Trans {
				lda = m
			}
			if tB == gblas.Trans {
				ldb = k
			}
			a, b := fill(m*k, 0.5), fill(k*n, -0.25)
			got, want := fill(m*n, 1), fill(m*n, 1)
			impl.Sgemm(tA, tB, m, n, k, 1.5, a, lda, b, ldb, 0.5, got, n)
			gonum.Implementation{}.Sgemm(tA, tB, m, n, k, 1.5, a, lda, b, ldb, 0.5, want, n)
			for i := range want {
				if math.Abs(float64(got[i]-want[i])) > 1e-4 {
					t.Fatalf("%s, tA=%c tB=%c: element %d is %v, gonum says %v", Name, tA, tB, i, got[i], want[i])
				}
			}
		}
	}
}

// Describe names the kernels OpenBLAS runs, and as OPENBLAS_CORETYPE asks
// when it is set.
func TestDescribeNamesTheKernels(t *testing.T) {
	if err := Setup(1); err != nil {
		t.Fatal(err)
	}
	d := Describe()
	t.Log(d)
	if Name != "openblas" {
		if d != Name {
			t.Errorf("Describe() = %q, want %q", d, Name)
		}
		return
	}
	if !strings.HasPrefix(d, Name+" (") || !strings.HasSuffix(d, ")") {
		t.Errorf("Describe() = %q, want %q and the kernels' name in parentheses", d, Name)
	}
	if want := os.Getenv("OPENBLAS_CORETYPE"); want != "" && !strings.Contains(strings.ToLower(d), strings.ToLower(want)) {
		t.Errorf("Describe() = %q with OPENBLAS_CORETYPE=%s", d, want)
	}
}
