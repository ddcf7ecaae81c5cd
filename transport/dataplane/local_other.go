//go:build !linux

package dataplane

import "net"

// peerIsUs is false off Linux, where no same-host socket is used.
func peerIsUs(net.Conn) bool { return false }

// peerIsUser is false off Linux, like peerIsUs.
func peerIsUser(net.Conn, int) bool { return false }

// peerOf knows no peer off Linux.
func peerOf(net.Conn) (peerProc, bool) { return peerProc{}, false }
