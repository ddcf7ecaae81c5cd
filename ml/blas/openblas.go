//go:build cgo && !purego

package blas

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

// The two OpenBLAS entry points pstrain calls, resolved by Setup. The
// library is opened at run time, not linked, so that processes which never
// multiply matrices (parameter servers, the launcher, `pstrain top`) do
// not keep it: it cost each of them 2-3 MiB of resident memory and a
// thread (docs/scaling.md, "Memory"). The launcher only probes it (Check).
enum { rowMajor = 101, noTrans = 111, trans = 112 }; // cblas.h's values
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*threads_fn)(int);
typedef char *(*corename_fn)(void);
static void *pstrain_handle;
static sgemm_fn pstrain_sgemm_ptr;
static threads_fn pstrain_threads_ptr;
static corename_fn pstrain_corename_ptr; // optional: NULL if the library lacks it

// pstrain_blas_open loads OpenBLAS from name; NULL on success, else why not.
static const char *pstrain_blas_open(const char *name) {
	static char why[512];
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		snprintf(why, sizeof why, "%s", dlerror()); // dlerror's text lasts only until its next call
		return why;
	}
	sgemm_fn s = (sgemm_fn)dlsym(h, "cblas_sgemm");
	threads_fn t = (threads_fn)dlsym(h, "openblas_set_num_threads");
	if (s == NULL || t == NULL) {
		dlclose(h);
		return "the library has no cblas_sgemm or openblas_set_num_threads";
	}
	pstrain_handle = h;
	pstrain_sgemm_ptr = s;
	pstrain_threads_ptr = t;
	pstrain_corename_ptr = (corename_fn)dlsym(h, "openblas_get_corename");
	return NULL;
}

// pstrain_blas_reload loads the library pstrain_blas_open loaded again,
// from name, with OPENBLAS_CORETYPE set to coretype (NULL: unset) while
// its constructor chooses the kernels; NULL on success, else why not.
// The variable is unset again after: nothing else in the process reads
// C's environment (Go keeps its own copy), and this runs once, when a
// task starts, before it opens any connection.
static const char *pstrain_blas_reload(const char *name, const char *coretype) {
	dlclose(pstrain_handle);
	pstrain_handle = NULL;
	pstrain_sgemm_ptr = NULL;
	pstrain_threads_ptr = NULL;
	pstrain_corename_ptr = NULL;
	if (coretype != NULL)
		setenv("OPENBLAS_CORETYPE", coretype, 1);
	const char *why = pstrain_blas_open(name);
	unsetenv("OPENBLAS_CORETYPE");
	return why;
}

// pstrain_blas_config is the loaded library's build configuration
// ("OpenBLAS 0.3.21 DYNAMIC_ARCH ..."), NULL if it cannot say.
static const char *pstrain_blas_config(void) {
	typedef char *(*config_fn)(void);
	config_fn f = pstrain_handle == NULL ? NULL : (config_fn)dlsym(pstrain_handle, "openblas_get_config");
	return f == NULL ? NULL : f();
}

// pstrain_blas_probe opens OpenBLAS from name, checks its entry points
// and closes it again; NULL if it loads, else why not. For a process
// that multiplies nothing (the launcher's preflight).
static const char *pstrain_blas_probe(const char *name) {
	static char why[512];
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		snprintf(why, sizeof why, "%s", dlerror());
		return why;
	}
	int ok = dlsym(h, "cblas_sgemm") != NULL && dlsym(h, "openblas_set_num_threads") != NULL;
	dlclose(h);
	return ok ? NULL : "the library has no cblas_sgemm or openblas_set_num_threads";
}

static const char *pstrain_corename(void) {
	return pstrain_corename_ptr == NULL ? NULL : pstrain_corename_ptr();
}

static void pstrain_set_threads(int n) { pstrain_threads_ptr(n); }

static void pstrain_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                          const float *b, int ldb, float beta, float *c, int ldc) {
	pstrain_sgemm_ptr(rowMajor, ta ? trans : noTrans, tb ? trans : noTrans, m, n, k,
	                  alpha, a, lda, b, ldb, beta, c, ldc);
}
*/
import "C"

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/cpu"
	gblas "gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
	"gorgonia.org/gorgonia"
)

// Name says which BLAS this binary uses.
const Name = "openblas"

// loader opens OpenBLAS once: a loaded library, like gorgonia's choice of
// BLAS, belongs to the whole process.
var loader struct {
	once sync.Once
	err  error
	core string // the kernels OpenBLAS chose ("" if it cannot say)
}

// libNames are the names OpenBLAS is loaded by: Debian's runtime package
// (libopenblas0) provides the first, the -dev package the second.
func libNames() []string { return []string{"libopenblas.so.0", "libopenblas.so"} }

func open() error {
	loader.once.Do(func() {
		var why []string
		for _, name := range libNames() {
			cname := C.CString(name)
			defer C.free(unsafe.Pointer(cname))
			if msg := C.pstrain_blas_open(cname); msg != nil {
				why = append(why, C.GoString(msg))
				continue
			}
			loader.core = corename()
			_, set := os.LookupEnv("OPENBLAS_CORETYPE")
			if want := betterCore(loader.core, cpuOf(), set); want != "" && canReload(config()) {
				loader.err = reload(cname, want)
			}
			return
		}
		loader.err = missing(why)
	})
	return loader.err
}

// reload loads the library again asking for the kernels want; if that
// fails, again as it was.
func reload(cname *C.char, want string) error {
	cwant := C.CString(want)
	defer C.free(unsafe.Pointer(cwant))
	msg := C.pstrain_blas_reload(cname, cwant)
	if msg != nil {
		first := C.GoString(msg)
		if msg = C.pstrain_blas_reload(cname, nil); msg != nil {
			return fmt.Errorf("blas: loading OpenBLAS again for its %s kernels: %s; then as it was: %s", want, first, C.GoString(msg))
		}
	}
	loader.core = corename()
	return nil
}

func missing(why []string) error {
	return fmt.Errorf("blas: cannot load OpenBLAS (%s); install it (Debian: apt-get install libopenblas0) or build with -tags purego", strings.Join(why, "; "))
}

// config is the loaded library's build configuration ("" if it cannot
// say).
func config() string {
	if c := C.pstrain_blas_config(); c != nil {
		return C.GoString(c)
	}
	return ""
}

// canReload says whether a library of build configuration cfg may be
// loaded again for other kernels: it must choose its kernels when it
// loads (DYNAMIC_ARCH: else OPENBLAS_CORETYPE changes nothing), and be
// 0.3.5 or newer (older ones could crash when unloaded, OpenBLAS#1720).
func canReload(cfg string) bool {
	f := strings.Fields(cfg)
	if len(f) < 2 || f[0] != "OpenBLAS" || !slices.Contains(f, "DYNAMIC_ARCH") {
		return false
	}
	var major, minor, patch int
	if n, _ := fmt.Sscanf(f[1], "%d.%d.%d", &major, &minor, &patch); n < 2 {
		return false
	}
	return major > 0 || minor > 3 || minor == 3 && patch >= 5
}

// corename is the kernels the loaded library runs ("" if it cannot say).
func corename() string {
	if c := C.pstrain_corename(); c != nil {
		return strings.TrimSpace(C.GoString(c))
	}
	return ""
}

// cpuFeatures are the instruction sets OpenBLAS's kernels are chosen by,
// as the CPU and the OS offer them.
type cpuFeatures struct {
	avx2 bool // AVX2 and FMA: what OpenBLAS's Haswell kernels need
}

func cpuOf() cpuFeatures {
	return cpuFeatures{avx2: cpu.X86.HasAVX2 && cpu.X86.HasFMA}
}

// betterCore is the kernel family to load OpenBLAS again with ("": keep
// what it chose) when it chose loaded on a CPU with features f, and the
// user set OPENBLAS_CORETYPE or not (set). OpenBLAS chooses by the CPU's
// model number, and a library older than the CPU does not know it:
// Debian 12's OpenBLAS 0.3.21 runs its Prescott kernels (SSE3, a quarter
// of the speed of its AVX-512 ones) on Xeons of 2023. On a CPU with AVX2
// and FMA such a choice is replaced by the Haswell kernels: not the
// fastest on a CPU with AVX-512, but the family every AVX2 CPU runs
// correctly, where older OpenBLAS builds miscompute or crash with their
// AVX-512 kernels on some CPUs (docs/scaling.md, "The compute
// ceiling"). A choice the library made with AVX2 or wider is kept, and
// so is the user's.
func betterCore(loaded string, f cpuFeatures, set bool) string {
	// OpenBLAS's kernel families without AVX2 (openblas_get_corename's
	// names, lower case).
	older := []string{"unknown", "katmai", "coppermine", "northwood", "prescott", "banias", "atom",
		"core2", "penryn", "dunnington", "nehalem", "athlon", "opteron", "opteron_sse3", "barcelona", "nano",
		"sandybridge", "bobcat", "bulldozer", "piledriver", "steamroller"}
	if set || !f.avx2 || !slices.Contains(older, strings.ToLower(loaded)) {
		return ""
	}
	return "Haswell"
}

// impl is gonum's implementation with Sgemm replaced by OpenBLAS; Setup
// installs it once the library is loaded.
type impl struct{ gonum.Implementation }

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Sgemm computes C = alpha*op(A)*op(B) + beta*C in row-major order.
func (impl) Sgemm(tA, tB gblas.Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
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
	C.pstrain_sgemm(cbool(tA != gblas.NoTrans), cbool(tB != gblas.NoTrans), C.int(m), C.int(n), C.int(k),
		C.float(alpha), pa, C.int(lda), pb, C.int(ldb), C.float(beta),
		(*C.float)(unsafe.Pointer(&c[0])), C.int(ldc))
}

// Describe names the BLAS and the kernels it runs, as OpenBLAS chose them
// when it was loaded (by the CPU's model, or as OPENBLAS_CORETYPE says,
// or Haswell's when pstrain asked for them: betterCore): "openblas
// (Haswell)". Where the kernels cannot be told, just Name.
func Describe() string {
	if open() != nil || loader.core == "" {
		return Name
	}
	return Name + " (" + loader.core + ")"
}

// Check reports why OpenBLAS cannot be loaded, if it cannot: it opens the
// library and closes it again, so that the caller (`pstrain run`, before
// it starts any task) does not keep it. A machine without the library
// then fails once, with the remedy, instead of restarting every task in
// vain.
func Check() error {
	var why []string
	for _, name := range libNames() {
		cname := C.CString(name)
		msg := C.pstrain_blas_probe(cname)
		C.free(unsafe.Pointer(cname))
		if msg == nil {
			return nil
		}
		why = append(why, C.GoString(msg))
	}
	return missing(why)
}

// Setup loads OpenBLAS and makes gorgonia use it with the given number of
// threads (<= 0 means 1).
func Setup(threads int) error {
	if err := open(); err != nil {
		return err
	}
	if threads <= 0 {
		threads = 1
	}
	C.pstrain_set_threads(C.int(threads))
	gorgonia.Use(impl{})
	return nil
}
