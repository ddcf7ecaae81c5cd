//go:build linux

package dataset

import (
	"os"
	"syscall"
)

// fileIdentity is what a stamp compares of fi: size, modification and
// status-change times, inode and device (MD5 left empty).
func fileIdentity(fi os.FileInfo) (stamp, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return stamp{}, false
	}
	return stamp{Size: fi.Size(), MtimeNs: fi.ModTime().UnixNano(), CtimeNs: st.Ctim.Nano(),
		Inode: st.Ino, Dev: uint64(st.Dev)}, true // Dev is uint32 on some architectures
}
