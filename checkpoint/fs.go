package checkpoint

import (
	"io"
	"io/fs"
	"os"
	"runtime"
)

// FS is the small filesystem interface the checkpoint store needs, in the
// spirit of pebble's vfs.FS. Paths use the host's separator (the store
// builds them with path/filepath).
//
// The durability model is POSIX's: data written to a File is durable only
// after File.Sync; the creation, rename or removal of a directory entry is
// durable only after SyncDir of the directory holding it.
type FS interface {
	// Create creates or truncates the named file, opened for writing
	// and reading.
	Create(name string, perm fs.FileMode) (File, error)
	// Open opens the named file for reading.
	Open(name string) (File, error)
	// Rename atomically replaces newname with oldname.
	Rename(oldname, newname string) error
	// Remove removes a file or an empty directory.
	Remove(name string) error
	// RemoveAll removes path and anything it contains; a missing path
	// is not an error.
	RemoveAll(path string) error
	// MkdirAll creates dir and any missing parents.
	MkdirAll(dir string, perm fs.FileMode) error
	// ReadDir lists dir sorted by name.
	ReadDir(dir string) ([]fs.DirEntry, error)
	// Stat describes the named file.
	Stat(name string) (fs.FileInfo, error)
	// SyncDir makes the entries of directory dir durable (fsync of the
	// directory itself).
	SyncDir(dir string) error
}

// File is an open file of an FS.
type File interface {
	io.Writer
	io.ReaderAt
	io.Closer
	// Sync makes the data written so far durable.
	Sync() error
	// Stat describes the open file.
	Stat() (fs.FileInfo, error)
}

// OSFS is the FS of the operating system.
type OSFS struct{}

var _ FS = OSFS{}

// Create implements FS.
func (OSFS) Create(name string, perm fs.FileMode) (File, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, perm)
}

// Open implements FS.
func (OSFS) Open(name string) (File, error) { return os.Open(name) }

// Rename implements FS.
func (OSFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// Remove implements FS.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// RemoveAll implements FS.
func (OSFS) RemoveAll(path string) error { return os.RemoveAll(path) }

// MkdirAll implements FS.
func (OSFS) MkdirAll(dir string, perm fs.FileMode) error { return os.MkdirAll(dir, perm) }

// ReadDir implements FS.
func (OSFS) ReadDir(dir string) ([]fs.DirEntry, error) { return os.ReadDir(dir) }

// Stat implements FS.
func (OSFS) Stat(name string) (fs.FileInfo, error) { return os.Stat(name) }

// SyncDir implements FS. On Windows, where directories cannot be
// fsynced (and renames are durable once they return), it only checks that
// dir exists.
func (OSFS) SyncDir(dir string) error {
	if runtime.GOOS == "windows" {
		_, err := os.Stat(dir)
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return err
	}
	return d.Close()
}
