//go:build unix

package atomicfile

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteHonoursTheUmaskUnlessExact: under umask 077 a file written
// 0644 is 0600, as os.WriteFile's would be, and 0644 with ExactMode.
func TestWriteHonoursTheUmaskUnlessExact(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	for _, c := range []struct {
		o    Options
		want os.FileMode
	}{{Options{}, 0o600}, {Options{ExactMode: true}, 0o644}} {
		path := filepath.Join(dir, "f")
		if err := Write(path, []byte("x"), 0o644, c.o); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != c.want {
			t.Errorf("%+v: mode %v (%v), want %v", c.o, fi.Mode().Perm(), err, c.want)
		}
	}
}
