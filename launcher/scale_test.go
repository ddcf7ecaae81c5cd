package launcher

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pstrain/pstrain/chief"
)

// RequestScale writes a request only for a live run and in range, in
// every mode; each request has the next sequence number.
func TestRequestScale(t *testing.T) {
	dir := t.TempDir()
	if _, err := RequestScale(dir, 2); !errors.Is(err, ErrNoRun) {
		t.Fatalf("no launcher: %v, want ErrNoRun", err)
	}
	// This test process stands for the launcher.
	pids := filepath.Join(dir, "pids")
	if err := os.MkdirAll(pids, 0o755); err != nil {
		t.Fatal(err)
	}
	fs := procFS("/proc")
	cl, err := fs.cmdline(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := writePidFile(pids, fs.record("launcher", os.Getpid(), cl)); err != nil {
		t.Fatal(err)
	}
	if _, err := RequestScale(dir, 2); !errors.Is(err, ErrNoRun) {
		t.Fatalf("no scale status: %v, want ErrNoRun", err)
	}
	status := func(st ScaleStatus) {
		t.Helper()
		if err := writeJSON(filepath.Join(dir, ScaleStatusFile), st); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range []string{"sync", "async", "ssp"} {
		status(ScaleStatus{Mode: mode, MaxWorkers: 4, Workers: 2})
		for _, n := range []int{0, 5} {
			if _, err := RequestScale(dir, n); !errors.Is(err, ErrBadScale) {
				t.Errorf("%s: %d workers of at most 4: %v, want ErrBadScale", mode, n, err)
			}
		}
	}
	for i, n := range []int{4, 1} {
		was, err := RequestScale(dir, n)
		if err != nil || was != 2 {
			t.Fatalf("scale to %d: was %d, %v", n, was, err)
		}
		r, err := chief.ReadScaleRequest(filepath.Join(dir, ScaleRequestFile))
		if err != nil || r.Workers != n || r.Seq != int64(i+1) {
			t.Fatalf("request %+v, %v; want %d workers, seq %d", r, err, n, i+1)
		}
	}
}

// Requests written at once each get a sequence number of their own, so
// that none is taken for a request already seen (the last one written
// is the one in effect), and the file is always whole.
func TestScaleRequestsWrittenAtOnce(t *testing.T) {
	dir := t.TempDir()
	const n = 16
	seqs := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { seqs[i], errs[i] = writeScaleRequestSeq(dir, chief.ScaleRequest{Workers: i + 1}) })
	}
	wg.Wait()
	seen := map[int64]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if seen[seqs[i]] {
			t.Fatalf("sequence number %d given twice: %v", seqs[i], seqs)
		}
		seen[seqs[i]] = true
	}
	r, err := chief.ReadScaleRequest(filepath.Join(dir, ScaleRequestFile))
	if err != nil {
		t.Fatal(err)
	}
	if r.Seq != n || seqs[r.Workers-1] != n {
		t.Fatalf("the file holds request %+v, want the one of sequence %d (%v)", r, n, seqs)
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(tmp) > 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
}
