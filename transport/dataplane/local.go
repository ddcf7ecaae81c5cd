package dataplane

import (
	"context"
	"net"
	"runtime"
)

// Same-host data planes: a server listening on a loopback TCP
// address also listens on a Unix-domain socket in Linux's abstract
// namespace named after that address, and a client whose server's
// address is a loopback one dials that socket first. The frames, limits
// and credentials are the same; the kernel's TCP path is not taken (no
// segmentation, acknowledgements or loopback device), which saves CPU
// on the two cores every task shares (docs/scaling.md). An abstract
// socket is reachable by exactly the processes that can reach the
// loopback address (those of the same network namespace) and vanishes
// with its listener. TLS connections stay on TCP.

// localNetwork is the network of a same-host data plane.
const localNetwork = "unix"

// localBuffer is the socket buffer asked for on both ends of a same-host
// connection (the kernel caps it at net.core.wmem_max / rmem_max). A
// Unix stream socket queues at most its sender's buffer (212,992 bytes
// by default), so a 1.3 MB push or pull would reach the reader in six or
// more pieces, each a wake-up of the reading process; with 4 MiB the
// writer's one writev queues it whole.
const localBuffer = 4 << 20

// tune sets a same-host connection's buffers (best effort).
func tune(c net.Conn) net.Conn {
	if uc, ok := c.(*net.UnixConn); ok {
		uc.SetWriteBuffer(localBuffer)
		uc.SetReadBuffer(localBuffer)
	}
	return c
}

// localName is the abstract socket beside a data plane listening on
// tcpAddr, or "" when there is none: not Linux (no abstract namespace),
// or not a loopback IP address. The name holds the whole address (IP and
// port), which only one TCP listener can hold at a time; a host name
// such as localhost is not resolved, so such an address stays on TCP.
func localName(tcpAddr string) string {
	if runtime.GOOS != "linux" {
		return ""
	}
	host, port, err := net.SplitHostPort(tcpAddr)
	if err != nil {
		return ""
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return ""
	}
	return "@pstrain-dataplane/" + net.JoinHostPort(ip.String(), port)
}

// listenLocal opens the same-host socket beside lis when lis is a plain
// TCP listener on a loopback address; nil otherwise, or when it cannot be
// opened (the TCP listener serves everyone then).
func listenLocal(lis net.Listener) net.Listener {
	if _, ok := lis.(*net.TCPListener); !ok {
		return nil // TLS, or a wrapper whose semantics a second listener would bypass
	}
	name := localName(lis.Addr().String())
	if name == "" {
		return nil
	}
	l, err := net.Listen(localNetwork, name)
	if err != nil {
		return nil
	}
	return tunedListener{l}
}

// tunedListener tunes each connection it accepts.
type tunedListener struct{ net.Listener }

func (l tunedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return tune(c), nil
}

// dialLocal dials the same-host socket of the data plane at tcpAddr; nil
// if there is none (then the client dials TCP).
func dialLocal(ctx context.Context, d *net.Dialer, tcpAddr string) net.Conn {
	name := localName(tcpAddr)
	if name == "" {
		return nil
	}
	conn, err := d.DialContext(ctx, localNetwork, name)
	if err != nil {
		return nil
	}
	if !peerIsUs(conn) {
		// An abstract name can be taken by any local process before the
		// PS binds it (the PS then serves TCP only, and says nothing):
		// talk only to a process of our own user.
		conn.Close()
		return nil
	}
	return tune(conn)
}
