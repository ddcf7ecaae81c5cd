package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"sync"
)

// ErrInjected is wrapped by the errors that a FaultFS injects.
var ErrInjected = errors.New("checkpoint: injected fault")

// FaultFS wraps an FS and injects a fault at the k-th operation (counting
// from 0, over FS and File methods alike). In fail mode only that operation
// fails and later ones proceed; in crash mode that operation and every
// later one fail, as if the process had died there (pair it with
// MemFS.Crash to drop what was not durable). It also records the
// operations it saw, for debugging and ordering assertions.
type FaultFS struct {
	inner  FS
	failAt int
	crash  bool

	mu   sync.Mutex
	n    int
	dead bool
	ops  []string
}

var _ FS = (*FaultFS)(nil)

// NewFaultFS wraps inner, injecting a fault at operation failAt (never if
// failAt < 0); crash selects crash mode.
func NewFaultFS(inner FS, failAt int, crash bool) *FaultFS {
	return &FaultFS{inner: inner, failAt: failAt, crash: crash}
}

// Count returns the number of operations attempted so far.
func (f *FaultFS) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// Ops returns a description of every operation attempted so far, in order.
func (f *FaultFS) Ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ops...)
}

// Triggered reports whether the fault has been injected.
func (f *FaultFS) Triggered() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failAt >= 0 && f.n > f.failAt
}

func (f *FaultFS) hit(op, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.n
	f.n++
	desc := op + " " + name
	f.ops = append(f.ops, desc)
	if f.dead {
		return fmt.Errorf("%s: %w (process crashed at operation %d)", desc, ErrInjected, f.failAt)
	}
	if i == f.failAt {
		f.dead = f.crash
		return fmt.Errorf("%s: %w at operation %d", desc, ErrInjected, i)
	}
	return nil
}

// Create implements FS.
func (f *FaultFS) Create(name string, perm fs.FileMode) (File, error) {
	if err := f.hit("create", name); err != nil {
		return nil, err
	}
	file, err := f.inner.Create(name, perm)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, name: name}, nil
}

// Open implements FS.
func (f *FaultFS) Open(name string) (File, error) {
	if err := f.hit("open", name); err != nil {
		return nil, err
	}
	file, err := f.inner.Open(name)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, name: name}, nil
}

// Rename implements FS.
func (f *FaultFS) Rename(oldname, newname string) error {
	if err := f.hit("rename", oldname+" -> "+newname); err != nil {
		return err
	}
	return f.inner.Rename(oldname, newname)
}

// Remove implements FS.
func (f *FaultFS) Remove(name string) error {
	if err := f.hit("remove", name); err != nil {
		return err
	}
	return f.inner.Remove(name)
}

// RemoveAll implements FS.
func (f *FaultFS) RemoveAll(name string) error {
	if err := f.hit("removeall", name); err != nil {
		return err
	}
	return f.inner.RemoveAll(name)
}

// MkdirAll implements FS.
func (f *FaultFS) MkdirAll(dir string, perm fs.FileMode) error {
	if err := f.hit("mkdirall", dir); err != nil {
		return err
	}
	return f.inner.MkdirAll(dir, perm)
}

// ReadDir implements FS.
func (f *FaultFS) ReadDir(dir string) ([]fs.DirEntry, error) {
	if err := f.hit("readdir", dir); err != nil {
		return nil, err
	}
	return f.inner.ReadDir(dir)
}

// Stat implements FS.
func (f *FaultFS) Stat(name string) (fs.FileInfo, error) {
	if err := f.hit("stat", name); err != nil {
		return nil, err
	}
	return f.inner.Stat(name)
}

// SyncDir implements FS.
func (f *FaultFS) SyncDir(dir string) error {
	if err := f.hit("syncdir", dir); err != nil {
		return err
	}
	return f.inner.SyncDir(dir)
}

type faultFile struct {
	File
	fs   *FaultFS
	name string
}

func (f *faultFile) Write(p []byte) (int, error) {
	if err := f.fs.hit("write", f.name); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f *faultFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.hit("readat", f.name); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

func (f *faultFile) Sync() error {
	if err := f.fs.hit("sync", f.name); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *faultFile) Stat() (fs.FileInfo, error) {
	if err := f.fs.hit("fstat", f.name); err != nil {
		return nil, err
	}
	return f.File.Stat()
}

func (f *faultFile) Close() error {
	if err := f.fs.hit("close", f.name); err != nil {
		// Release the underlying handle anyway: a dead process's
		// descriptors are closed by the kernel.
		f.File.Close()
		return err
	}
	return f.File.Close()
}
