package checkpoint

import (
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

func writeFile(t *testing.T, fsys FS, name, data string, sync bool) {
	t.Helper()
	f, err := fsys.Create(name, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func fileContents(t *testing.T, fsys FS, name string) (string, bool) {
	t.Helper()
	f, err := fsys.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, fi.Size())
	if err := readFullAt(f, b, 0); err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

func mustNo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestMemFSCrashSemantics(t *testing.T) {
	m := NewMemFS()
	mustNo(t, m.MkdirAll("/d", 0o755))
	mustNo(t, m.SyncDir("/"))

	writeFile(t, m, "/d/synced", "durable", true)
	writeFile(t, m, "/d/unsynced", "volatile", false)
	mustNo(t, m.SyncDir("/d"))
	// A rename not made durable.
	writeFile(t, m, "/d/renamed-src", "x", true)
	mustNo(t, m.SyncDir("/d"))
	// Created and synced, but its entry never made durable.
	writeFile(t, m, "/d/nodirsync", "lost", true)
	mustNo(t, m.Rename("/d/renamed-src", "/d/renamed-dst"))
	// A directory whose entry in its parent is not durable.
	mustNo(t, m.MkdirAll("/e/f", 0o755))
	writeFile(t, m, "/e/f/g", "g", true)
	mustNo(t, m.SyncDir("/e/f"))
	mustNo(t, m.SyncDir("/e"))
	// A removal not made durable.
	mustNo(t, m.Remove("/d/synced"))

	f, err := m.Create("/d/open", 0o600)
	mustNo(t, err)

	m.Crash()

	for name, want := range map[string]string{
		"/d/synced":       "durable",
		"/d/unsynced":     "",
		"/d/renamed-src":  "x",
		"/d/nodirsync":    "<missing>",
		"/d/renamed-dst":  "<missing>",
		"/d/open":         "<missing>",
		"/e/f/g":          "<missing>",
		"relative/d/none": "<missing>",
	} {
		got, ok := fileContents(t, m, name)
		if !ok {
			got = "<missing>"
		}
		if got != want {
			t.Errorf("after crash %s = %q, want %q", name, got, want)
		}
	}
	if _, err := f.Write([]byte("x")); err == nil {
		t.Error("write through a handle opened before the crash succeeded")
	}

	// Durable operations survive.
	mustNo(t, m.Rename("/d/renamed-src", "/d/renamed-dst"))
	mustNo(t, m.SyncDir("/d"))
	m.Crash()
	if got, _ := fileContents(t, m, "d/renamed-dst"); got != "x" {
		t.Errorf("durable rename lost: %q", got)
	}
}

func TestMemFSOperations(t *testing.T) {
	m := NewMemFS()
	mustNo(t, m.MkdirAll("a/b", 0o755))
	writeFile(t, m, "a/b/f", "hello", false)
	if err := m.MkdirAll("a/b/f/g", 0o755); err == nil {
		t.Error("MkdirAll through a file succeeded")
	}
	if err := m.Remove("a/b"); err == nil {
		t.Error("Remove of a non-empty directory succeeded")
	}
	mustNo(t, m.MkdirAll("a/c/x", 0o755))
	if err := m.Rename("a/b", "a/c"); err == nil {
		t.Error("Rename onto a non-empty directory succeeded")
	}
	if err := m.Rename("a", "a/b/z"); err == nil {
		t.Error("Rename into its own subtree succeeded")
	}
	mustNo(t, m.Rename("a/b", "a/d"))
	entries, err := m.ReadDir("a")
	mustNo(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 2 || names[0] != "c" || names[1] != "d" {
		t.Errorf("ReadDir = %v, want [c d]", names)
	}
	fi, err := m.Stat("a/d/f")
	mustNo(t, err)
	if fi.Size() != 5 || fi.IsDir() || fi.Name() != "f" {
		t.Errorf("Stat = %v %v %v", fi.Name(), fi.Size(), fi.IsDir())
	}
	mustNo(t, m.RemoveAll("a/d"))
	mustNo(t, m.RemoveAll("a/nonexistent"))
	if _, err := m.Stat("a/d/f"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat after RemoveAll: %v", err)
	}
	r, err := m.Open("a/c")
	mustNo(t, err)
	if _, err := r.Write([]byte("x")); err == nil {
		t.Error("write to a read-only handle succeeded")
	}
	mustNo(t, r.Close())
	if err := r.Close(); err == nil {
		t.Error("double close succeeded")
	}
}

func TestFaultFS(t *testing.T) {
	for _, crash := range []bool{false, true} {
		m := NewMemFS()
		f := NewFaultFS(m, 1, crash)
		mustNo(t, f.MkdirAll("d", 0o755))                        // op 0
		if err := f.SyncDir("d"); !errors.Is(err, ErrInjected) { // op 1
			t.Fatalf("crash=%v: op 1 err = %v, want ErrInjected", crash, err)
		}
		err := f.SyncDir("d") // op 2
		if crash != errors.Is(err, ErrInjected) {
			t.Fatalf("crash=%v: op 2 err = %v", crash, err)
		}
		if !f.Triggered() || f.Count() != 3 || len(f.Ops()) != 3 {
			t.Fatalf("crash=%v: Triggered=%v Count=%d Ops=%v", crash, f.Triggered(), f.Count(), f.Ops())
		}
	}
	// File operations are counted too.
	m := NewMemFS()
	f := NewFaultFS(m, -1, false)
	writeFile(t, f, filepath.Join("x"), "data", true)
	if got := f.Ops(); len(got) != 4 || got[0] != "create x" || got[1] != "write x" || got[2] != "sync x" || got[3] != "close x" {
		t.Fatalf("Ops = %q", got)
	}
}

func TestOSFSSyncDir(t *testing.T) {
	dir := t.TempDir()
	var fsys FS = OSFS{}
	writeFile(t, fsys, filepath.Join(dir, "f"), "abc", true)
	mustNo(t, fsys.SyncDir(dir))
	if got, _ := fileContents(t, fsys, filepath.Join(dir, "f")); got != "abc" {
		t.Fatalf("got %q", got)
	}
	if err := fsys.SyncDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("SyncDir of a missing directory succeeded")
	}
}
