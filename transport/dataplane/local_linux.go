package dataplane

import (
	"net"
	"os"
	"syscall"
)

// peerIsUs reports whether the process at the other end of a Unix
// connection runs as this process's effective user (SO_PEERCRED).
func peerIsUs(c net.Conn) bool { return peerIsUser(c, os.Geteuid()) }

// peerIsUser reports whether the process at the other end of a Unix
// connection runs as uid.
func peerIsUser(c net.Conn, uid int) bool {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return false
	}
	return int(cred.Uid) == uid
}
