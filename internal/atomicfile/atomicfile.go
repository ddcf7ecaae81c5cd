// Package atomicfile replaces a file's content at once: a reader, or a
// process started again after a crash of the writer, finds the old
// content or the new, whole, never a part of either.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
)

// Options are how a file is written.
type Options struct {
	// Sync makes the new content survive a crash of the machine too: the
	// file is synced before it is renamed, and its directory after. It
	// costs a disk flush or two (a quarter of a millisecond on a local
	// SSD, far more on a network file system), so files written on a
	// hot path, or that a crash may lose, go without.
	Sync bool
	// ExactMode gives the file the mode perm whatever the process's
	// umask (which otherwise takes bits off it, as for os.WriteFile):
	// for a file other users' processes must read.
	ExactMode bool
}

// Write replaces path with data, of mode perm. The data goes to a
// temporary file of its own in path's directory (writers at once do not
// share one; the last rename wins), created with perm, so that a secret
// is never readable by others, not even for a moment, then renamed
// over path. On error the temporary file is removed and path is as it
// was.
func Write(path string, data []byte, perm fs.FileMode, o Options) (err error) {
	f, err := createTemp(path, perm)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	_, werr := f.Write(data)
	if werr == nil && o.Sync {
		werr = f.Sync()
	}
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if o.ExactMode {
		if err := os.Chmod(f.Name(), perm); err != nil {
			return err
		}
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	if o.Sync {
		return syncDir(filepath.Dir(path))
	}
	return nil
}

// createTemp creates a new file beside path, of mode perm less the
// umask: ".NAME.RANDOM.tmp".
func createTemp(path string, perm fs.FileMode) (*os.File, error) {
	dir, base := filepath.Dir(path), filepath.Base(path)
	for range 100 {
		name := filepath.Join(dir, "."+base+"."+strconv.FormatUint(rand.Uint64(), 36)+".tmp")
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
		if !errors.Is(err, fs.ErrExist) {
			return f, err
		}
	}
	return nil, fmt.Errorf("writing %s: no free temporary name after 100 tries", path)
}

// syncDir syncs directory dir, so that a rename in it is on disk.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
