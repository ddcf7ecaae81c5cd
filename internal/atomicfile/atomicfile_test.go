package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteReplacesWholeWithItsMode: a file written twice holds the
// second content, with the mode asked for, and no temporary file is
// left beside it.
func TestWriteReplacesWholeWithItsMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, c := range []struct {
		data string
		perm os.FileMode
		o    Options
	}{{"first, longer content", 0o644, Options{ExactMode: true}}, {"second", 0o600, Options{Sync: true, ExactMode: true}}} {
		if err := Write(path, []byte(c.data), c.perm, c.o); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != c.data {
			t.Fatalf("read %q (%v), want %q", got, err, c.data)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != c.perm {
			t.Errorf("mode %v, want %v", fi.Mode().Perm(), c.perm)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want the file alone", len(entries))
	}
}

// TestWriteFailingLeavesTheFileAndNoTemporary: a write that cannot
// replace its file (here: the path is a directory) returns an error,
// leaves what was there and removes its temporary file.
func TestWriteFailingLeavesTheFileAndNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "taken")
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "inside"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("data"), 0o644, Options{Sync: true}); err == nil {
		t.Fatal("replaced a directory holding a file; want an error")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || !entries[0].IsDir() {
		t.Errorf("the directory holds %v, want the directory alone", entries)
	}
	if err := Write(filepath.Join(dir, "missing", "file"), []byte("x"), 0o644, Options{}); err == nil {
		t.Error("wrote into a directory that does not exist; want an error")
	}
}
