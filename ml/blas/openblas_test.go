//go:build cgo && !purego

package blas

import (
	"os"
	"strings"
	"testing"
)

// OpenBLAS's choice is replaced only when it runs kernels older than AVX2
// on a CPU with AVX2, and the user did not choose.
func TestBetterCore(t *testing.T) {
	avx2 := cpuFeatures{avx2: true}
	for _, c := range []struct {
		loaded string
		f      cpuFeatures
		set    bool
		want   string
	}{
		{"Prescott", avx2, false, "Haswell"},
		{"Sandybridge", avx2, false, "Haswell"},
		{"", avx2, false, ""}, // a library that cannot say
		{"Prescott", avx2, true, ""},
		{"Prescott", cpuFeatures{}, false, ""},
		{"Haswell", avx2, false, ""},
		{"SkylakeX", avx2, false, ""},
		{"Zen", avx2, false, ""},
	} {
		if got := betterCore(c.loaded, c.f, c.set); got != c.want {
			t.Errorf("betterCore(%q, %+v, set %t) = %q, want %q", c.loaded, c.f, c.set, got, c.want)
		}
	}
}

// Loaded without OPENBLAS_CORETYPE on a CPU with AVX2, OpenBLAS runs
// kernels with AVX2 or wider, whatever its model number (OpenBLAS 0.3.21
// runs Prescott's on CPUs newer than itself).
func TestLoadedKernelsUseAVX2(t *testing.T) {
	if _, set := os.LookupEnv("OPENBLAS_CORETYPE"); set {
		t.Skip("OPENBLAS_CORETYPE is set: it chooses")
	}
	if !cpuOf().avx2 {
		t.Skip("this CPU has no AVX2: OpenBLAS chooses")
	}
	if err := Setup(1); err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{"Prescott", "Core2", "Nehalem", "Sandybridge", "Unknown"} {
		if strings.EqualFold(corename(), old) {
			t.Errorf("OpenBLAS runs its %s kernels (Describe %q) on a CPU with AVX2", corename(), Describe())
		}
	}
}
