// Package atomicfile replaces a file's content at once: a reader, or a
// process started again after a crash, finds the old content or the
// new, whole, never a part of either.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, of mode perm. The data goes to a
// temporary file of its own in path's directory (so that writers at
// once do not share one; the last rename wins), created 0600 so that a
// secret is never readable by others, not even for a moment; it is
// written, synced, given perm and renamed over path. On error the
// temporary file is removed and path is as it was.
func Write(path string, data []byte, perm fs.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if err := errors.Join(werr, f.Close()); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Chmod(f.Name(), perm); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
