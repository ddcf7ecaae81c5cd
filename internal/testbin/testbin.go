// Package testbin serves the multi-process tests of several packages
// (cmd/pstrain, dashboard, netlab, scripts/k8s): it builds the pstrain
// binary once per test process and finds the MNIST files they train on.
// Only tests import it.
package testbin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Binary is the pstrain binary, built on first use. Declare one per test
// package and call Remove from TestMain if the build should not outlive
// the tests.
type Binary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// Path builds ./cmd/pstrain of this module into a temporary directory the
// first time and returns the binary's path. A failed build fails t.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			b.err = err
			return
		}
		if b.dir, err = os.MkdirTemp("", "pstrain-test-bin"); err != nil {
			b.err = err
			return
		}
		p := filepath.Join(b.dir, "pstrain")
		cmd := exec.Command("go", "build", "-o", p, "./cmd/pstrain")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		b.path = p
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Remove deletes the build.
func (b *Binary) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// ModuleRoot is the nearest directory at or above the working directory
// that holds go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testbin: no go.mod above the working directory")
		}
		dir = parent
	}
}

// MNIST returns the absolute directory holding MNIST: $PSTRAIN_DATA_DIR, or
// data/ at the module root. Without the files t is skipped, or failed under
// CI=true (see NeedOrSkip).
func MNIST(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("PSTRAIN_DATA_DIR")
	if dir == "" {
		root, err := ModuleRoot()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "data")
	}
	// Absolute: the tests hand it to processes with other working
	// directories.
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	dir = abs
	if _, err := os.Stat(filepath.Join(dir, "train-images-idx3-ubyte")); err != nil {
		NeedOrSkip(t, fmt.Sprintf("MNIST not found in %s (run `make data`)", dir))
	}
	return dir
}

// NeedOrSkip skips t for a missing prerequisite, or fails it under
// CI=true, where every prerequisite is installed and a skip would hide a
// broken setup.
func NeedOrSkip(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI=true, so this is a failure rather than a skip")
	}
	t.Skip(msg)
}
