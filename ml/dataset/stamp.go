package dataset

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/pstrain/pstrain/internal/atomicfile"
)

// A verified stamp lets the tasks of a machine share one MD5 check of a
// data file. After a file's content hashed to its published sum, a stamp
// beside it (".NAME.verified", JSON) records the sum with the file's
// identity as it was before the hash was taken: size, modification time,
// status-change time, inode and device. A later check whose file has the
// same identity takes the stamp's word and skips the hash; any difference
// (a rewritten, replaced, truncated or touched file) hashes again. A stamp
// that cannot be written (a read-only directory) only means hashing every
// time.
//
// What it cannot see: a change that leaves size, both times and the inode
// as they were. Writes through the file system update the modification
// and status-change times (the status-change time even when a tool puts
// the modification time back), so such a change has to bypass the file
// system (a damaged disk, a write to the block device) or land within the
// same clock tick as the file's last write before it was hashed. Deleting
// the stamps (rm DIR/.*.verified) forces the next task to hash again;
// `pstrain data fetch` always hashes.
type stamp struct {
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	CtimeNs int64  `json:"ctime_ns"`
	Inode   uint64 `json:"inode"`
	Dev     uint64 `json:"dev"`
	MD5     string `json:"md5"`
}

// stampPath is where the stamp of the data file at path goes.
func stampPath(path string) string {
	dir, base := filepath.Split(path)
	return filepath.Join(dir, "."+base+".verified")
}

// stamped reports whether path's stamp says that a file with identity fi
// hashed to sum.
func stamped(path string, fi os.FileInfo, sum string) bool {
	want, ok := fileIdentity(fi)
	if !ok {
		return false
	}
	b, err := os.ReadFile(stampPath(path))
	if err != nil {
		return false
	}
	var got stamp
	if json.Unmarshal(b, &got) != nil {
		return false
	}
	want.MD5 = sum
	return got == want
}

// writeStamp records that the file at path, with identity fi, hashed to
// sum. It is best effort: an error leaves no stamp (or the old one), and
// the next check hashes again. The stamp is written to a temporary file
// and renamed, so concurrent tasks never read half of one.
func writeStamp(path string, fi os.FileInfo, sum string) {
	s, ok := fileIdentity(fi)
	if !ok {
		return
	}
	s.MD5 = sum
	b, _ := json.Marshal(s) // plain values: cannot fail
	// Readable by every user's tasks, as the data is; a stamp not
	// written is computed again next time.
	_ = atomicfile.Write(stampPath(path), b, 0o644, atomicfile.Options{ExactMode: true})
}

// checkSum checks that the uncompressed content of the data file at path
// hashes to f's published sum, skipping the hash when a stamp vouches for
// the file (see stamp), and stamps it after a hash that matched.
func checkSum(path string, f fileSpec) error {
	fi, err := os.Stat(path)
	if err == nil && stamped(path, fi, f.md5) {
		return nil
	}
	got, err := hashData(path)
	if err != nil {
		return err
	}
	if got != f.md5 {
		return checksumError(path, got, f)
	}
	if fi != nil {
		writeStamp(path, fi, got)
	}
	return nil
}
