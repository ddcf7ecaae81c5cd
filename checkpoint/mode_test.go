package checkpoint

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Checkpoints are private by default: the directories the store makes
// are 0700 and its files (shards, manifest) 0600, so only the run's user
// can read the model. WithMode widens them for a shared volume: 0750
// gives directories 0750 and files 0640.
func TestCheckpointPermissions(t *testing.T) {
	old := syscall.Umask(0o022) // the common umask; it only ever narrows
	defer syscall.Umask(old)
	for _, c := range []struct {
		mode        DirMode
		dirs, files fs.FileMode
		name        string
	}{
		{0, 0o700, 0o600, "default"},
		{0o750, 0o750, 0o640, "0750"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "ckpt")
			s := NewStore(OSFS{}, root, 0).WithMode(c.mode)
			saveCheckpoint(t, s, 7, 2)
			if _, _, err := s.Archive(time.Now()); err != nil {
				t.Fatal(err)
			}
			n := 0
			err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				fi, err := os.Stat(path)
				if err != nil {
					return err
				}
				want := c.files
				if d.IsDir() {
					want = c.dirs
				}
				if got := fi.Mode().Perm(); got != want {
					t.Errorf("%s: mode %o, want %o", path, got, want)
				}
				n++
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if n < 5 { // the root, the archive, the checkpoint, 2 shards, the manifest
				t.Errorf("walked %d entries, want the root, archive, checkpoint, shards and manifest", n)
			}
		})
	}
	// MemFS keeps the modes too, for tests that do not touch the disk.
	m := NewMemFS()
	s := NewStore(m, "/ck", 0)
	saveCheckpoint(t, s, 3, 1)
	for _, p := range []string{"/ck", s.Path(3), filepath.Join(s.Path(3), ManifestName)} {
		fi, err := m.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		want := fs.FileMode(0o600)
		if fi.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("memfs %s: %o, want %o", p, fi.Mode().Perm(), want)
		}
	}
}
