//go:build linux

package dataset

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// loadAndOpen checks the synthetic set both ways a task does: Load (the
// chief's and in-process runs') and OpenTrainSet's checks (a worker's).
func loadAndOpen(dir string, s synthSet) error {
	if _, _, err := loadVerified(dir, s.spec); err != nil {
		return err
	}
	_, err := openVerifiedTrain(dir, s.spec, nil)
	return err
}

// The first check of a file stamps it; a stamped file that has not
// changed is trusted without a hash; a byte corrupted in place (its
// modification time moved) or a file that grew is hashed again and
// refused.
func TestStampSkipsHashUntilFileChanges(t *testing.T) {
	s := newSynthSet()
	for _, change := range []string{"corrupt a byte, mtime moved", "append a byte"} {
		dir := t.TempDir()
		writeSynth(t, dir, s, [4]bool{})
		if err := loadAndOpen(dir, s); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, s.spec.files[2].name)
		if _, err := os.Stat(stampPath(p)); err != nil {
			t.Fatalf("no stamp after a verified load: %v", err)
		}
		fi, _ := os.Stat(p)
		bad := append([]byte{}, s.files[2]...)
		if change == "append a byte" {
			bad = append(bad, 0)
		} else {
			bad[20] ^= 1
		}
		if err := os.WriteFile(p, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		later := fi.ModTime().Add(time.Second)
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
		if _, _, err := loadVerified(dir, s.spec); !errors.Is(err, ErrChecksum) {
			t.Errorf("%s: Load: err = %v, want ErrChecksum", change, err)
		}
		if _, err := openVerifiedTrain(dir, s.spec, nil); !errors.Is(err, ErrChecksum) {
			t.Errorf("%s: OpenTrainSet: err = %v, want ErrChecksum", change, err)
		}
	}
}

// A stamp is trusted only for the identity it records: a file whose
// content is wrong but whose stamp vouches for its current size, times
// and inode (what an in-place change that bypasses the file system
// leaves) is read without a hash, as stamp's comment says; a stamp with
// another sum, or of another inode, is not.
func TestStampTrustsOnlyItsIdentity(t *testing.T) {
	s := newSynthSet()
	dir := t.TempDir()
	writeSynth(t, dir, s, [4]bool{})
	f := s.spec.files[2]
	p := filepath.Join(dir, f.name)
	bad := append([]byte{}, s.files[2]...)
	bad[20] ^= 1
	if err := os.WriteFile(p, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	writeStamp(p, fi, "0123456789abcdef0123456789abcdef")
	if _, err := readVerified(p, f); !errors.Is(err, ErrChecksum) {
		t.Errorf("stamp with another sum: err = %v, want ErrChecksum", err)
	}
	writeStamp(p, fi, f.md5) // a stamp matching the damaged file's identity
	if _, err := readVerified(p, f); err != nil {
		t.Errorf("stamp matching the file's identity not trusted: %v", err)
	}
	if err := checkSum(p, f); err != nil {
		t.Errorf("checkSum: stamp matching the file's identity not trusted: %v", err)
	}
	// The same bytes in a new file (another inode): hashed, refused.
	tmp := p + ".new"
	if err := os.WriteFile(tmp, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	if err := checkSum(p, f); !errors.Is(err, ErrChecksum) {
		t.Errorf("replaced file with the old mtime: err = %v, want ErrChecksum", err)
	}
}

// A directory where no stamp can be written still loads (every check
// hashes).
func TestStampReadOnlyDir(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root writes into read-only directories")
	}
	s := newSynthSet()
	dir := t.TempDir()
	writeSynth(t, dir, s, [4]bool{})
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o755)
	if err := loadAndOpen(dir, s); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stampPath(filepath.Join(dir, s.spec.files[0].name))); err == nil {
		t.Error("a stamp was written into a read-only directory")
	}
}
