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
	p, ok := peerOf(c)
	return ok && p.uid == uid
}

// peerOf is the process at the other end of a Unix connection, as the
// kernel recorded it when the connection was made (SO_PEERCRED); false
// if c is not one or the kernel does not say.
func peerOf(c net.Conn) (peerProc, bool) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peerProc{}, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peerProc{}, false
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return peerProc{}, false
	}
	return peerProc{uid: int(cred.Uid), pid: int(cred.Pid)}, true
}
