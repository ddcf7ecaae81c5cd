//go:build cgo && !purego

package blas

import (
	"os"
	"os/exec"
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

// Only a library that chooses its kernels when it loads, 0.3.5 or newer,
// is loaded again for other kernels.
func TestCanReload(t *testing.T) {
	for _, c := range []struct {
		cfg  string
		want bool
	}{
		{"OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64", true},
		{"OpenBLAS 0.3.5 DYNAMIC_ARCH", true},
		{"OpenBLAS 0.4.0 DYNAMIC_ARCH", true},
		{"OpenBLAS 1.0 DYNAMIC_ARCH", true},
		{"OpenBLAS 0.3.4 DYNAMIC_ARCH", false},
		{"OpenBLAS 0.2.20 DYNAMIC_ARCH", false},
		{"OpenBLAS 0.3.21 NO_AFFINITY Haswell", false}, // one kernel family, built in
		{"", false},
		{"BLIS 0.9 DYNAMIC_ARCH", false},
	} {
		if got := canReload(c.cfg); got != c.want {
			t.Errorf("canReload(%q) = %t, want %t", c.cfg, got, c.want)
		}
	}
}

// Check finds the library and leaves it unloaded: run in a process of
// its own (this test binary again), which then has no OpenBLAS mapped.
func TestCheckLeavesNothingLoaded(t *testing.T) {
	if os.Getenv("PSTRAIN_BLAS_CHECK_CHILD") == "1" {
		if err := Check(); err != nil {
			t.Fatal(err)
		}
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Skip(err)
		}
		if strings.Contains(string(maps), "libopenblas") {
			t.Fatal("OpenBLAS is still mapped after Check")
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCheckLeavesNothingLoaded$", "-test.v")
	cmd.Env = append(os.Environ(), "PSTRAIN_BLAS_CHECK_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("the child process: %v\n%s", err, out)
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
	t.Log(config())
	for _, old := range []string{"Prescott", "Core2", "Nehalem", "Sandybridge", "Unknown"} {
		if strings.EqualFold(corename(), old) {
			t.Errorf("OpenBLAS runs its %s kernels (Describe %q) on a CPU with AVX2", corename(), Describe())
		}
	}
}
