package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// regionName names the memfd (in /proc/PID/maps and fd listings).
const regionName = "pstrain-dataplane"

// regionSeals are the seals the server requires: the size can change no
// more (a region shrunk under the server's mapping would fault it with
// SIGBUS) and no other seal can be added (F_SEAL_FUTURE_WRITE would stop
// the server writing pulls).
const regionSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// newRegion makes a sealed memfd of size bytes and maps it; the caller
// closes fd once it is sent and unmaps mem when done.
func newRegion(size int) (mem []byte, fd int, err error) {
	fd, err = unix.MemfdCreate(regionName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("ftruncate: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, regionSeals); err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("sealing: %w", err)
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("mmap: %w", err)
	}
	return mem, fd, nil
}

// unmap releases a region's mapping (nil: nothing).
func unmap(mem []byte) {
	if mem != nil {
		unix.Munmap(mem)
	}
}

// offerRegion offers the server at the other end of conn a region of
// size bytes, before any frame. It returns the mapped region if the
// server took it, or nil and the server's status if it did not (the
// connection goes on without one). An error means the connection is of
// no further use (errNoPreamble: a server of an earlier build); the
// caller closes it.
func offerRegion(conn *net.UnixConn, size int, deadline time.Time) (mem []byte, st byte, err error) {
	mem, fd, err := newRegion(size)
	if err != nil {
		return nil, regionNotOffered, nil // nothing sent: carry on without
	}
	defer unix.Close(fd)
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	if _, _, err := conn.WriteMsgUnix(appendPreamble(nil, size), unix.UnixRights(fd), nil); err != nil {
		unmap(mem)
		return nil, 0, closedByServer(err)
	}
	var ack [ackLen]byte
	if n, err := io.ReadFull(conn, ack[:]); err != nil && (n < len(magic) || [4]byte(ack[:4]) != magic) {
		// Closed before answering (a server at its connection limit).
		unmap(mem)
		return nil, 0, closedByServer(err)
	}
	if [4]byte(ack[:4]) != preambleMagic {
		// A response frame: a server of an earlier build refusing the
		// preamble as a bad magic.
		unmap(mem)
		return nil, 0, errNoPreamble
	}
	if ack[4] != regionAccepted {
		unmap(mem)
		return nil, ack[4], nil
	}
	return mem, regionAccepted, nil
}

// takeRegion reads a same-host connection's first bytes: a client's
// preamble, which it answers (mem: the region if accepted), or the start
// of its first frame (a client that offers no region), which rd gives
// back before the rest of the connection. ok false: the connection is
// done.
func (s *Server) takeRegion(c *net.UnixConn) (mem []byte, rd io.Reader, ok bool) {
	c.SetReadDeadline(time.Now().Add(s.lim.IdleTimeout))
	defer c.SetReadDeadline(time.Time{})
	var pre [preambleLen]byte
	// Descriptors are taken only from a process of our own user. Closing
	// one runs its file's flush, which a file on a FUSE mount a foreign
	// process controls could make wait forever, holding the connection's
	// slot and Close; read without room for them, the kernel drops them
	// with no flush.
	same := peerIsUser(c, s.uid)
	var (
		n, oobn int
		err     error
		oob     []byte
	)
	if same {
		oob = make([]byte, unix.CmsgSpace(4*4)) // room for more fds than the one expected, to close them
		n, oobn, _, _, err = c.ReadMsgUnix(pre[:], oob)
		// On an error (the idle deadline passing, among others) recvmsg's
		// -1 comes back as n and oobn (Go's internal/poll passes it on),
		// and slicing with it crashed the PS: a connection from a process
		// of the same user that stayed silent for IdleTimeout was enough.
		n, oobn = max(n, 0), max(oobn, 0)
	} else {
		n, err = c.Read(pre[:])
	}
	fds := receivedFDs(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd) // a mapping needs no descriptor
		}
	}()
	if err != nil && n == 0 {
		if isTimeout(err) {
			s.cut(c, "idle", fmt.Errorf("no request for %v", s.lim.IdleTimeout))
		}
		return nil, nil, false
	}
	if n < len(preambleMagic) {
		// Begun, so the rest is due within FrameGrace, as a header's is.
		c.SetReadDeadline(time.Now().Add(s.lim.FrameGrace))
		m, err := io.ReadFull(c, pre[n:len(preambleMagic)])
		n += m
		if err != nil {
			return nil, io.MultiReader(bytes.NewReader(pre[:n]), c), true // the frame reader reports it
		}
	}
	if [4]byte(pre[:4]) != preambleMagic {
		// A frame: whatever arrived with it is not a region.
		return nil, io.MultiReader(bytes.NewReader(pre[:n]), c), true
	}
	c.SetReadDeadline(time.Now().Add(s.lim.FrameGrace))
	if _, err := io.ReadFull(c, pre[n:]); err != nil {
		if isTimeout(err) {
			s.cut(c, "slow", fmt.Errorf("preamble not in within %v", s.lim.FrameGrace))
		}
		return nil, nil, false
	}
	size := binary.LittleEndian.Uint64(pre[4:])
	st, mem, err := s.mapRegion(same, fds, size)
	if err != nil {
		s.refusal.Warn("shm", "data plane: shared-memory region refused; payloads go through the socket", "remote", c.RemoteAddr().String(), "err", err)
	}
	c.SetWriteDeadline(time.Now().Add(s.lim.FrameGrace))
	_, err = c.Write(appendAck(nil, st))
	c.SetWriteDeadline(time.Time{})
	if err != nil {
		unmap(mem)
		return nil, nil, false
	}
	if mem != nil {
		s.regions.Add(1)
	}
	return mem, c, true
}

// mapRegion checks and maps the region a client offered: only from a
// process of the server's user (same), one memfd on tmpfs sealed against
// resizing, of the announced size, no larger than a payload may be.
func (s *Server) mapRegion(same bool, fds []int, size uint64) (st byte, mem []byte, err error) {
	switch {
	case s.cfg.NoSharedMemory:
		return regionDisabled, nil, nil
	case !same:
		return regionForeign, nil, errors.New("the client runs as another user")
	case len(fds) != 1:
		return regionRefused, nil, fmt.Errorf("%d descriptors with the preamble, want 1", len(fds))
	}
	fd := fds[0]
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return regionRefused, nil, fmt.Errorf("not a memfd: %w", err)
	}
	if seals&regionSeals != regionSeals {
		return regionRefused, nil, fmt.Errorf("region not sealed against resizing (seals %#x, want %#x)", seals, regionSeals)
	}
	// Only tmpfs pages (a plain memfd's): a hugetlbfs memfd passes the
	// checks above, but its pages can run out under the mapping, and a
	// copy into it would fault the whole process.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return regionRefused, nil, fmt.Errorf("fstatfs: %w", err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return regionRefused, nil, fmt.Errorf("region is not on tmpfs (file system %#x): not a plain memfd", fs.Type)
	}
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil {
		return regionRefused, nil, fmt.Errorf("fstat: %w", err)
	}
	limit := uint64(regionSize(s.cfg.MaxPayload, s.cfg.MaxPayload))
	switch {
	case st2.Mode&unix.S_IFMT != unix.S_IFREG:
		return regionRefused, nil, errors.New("region is not a regular file")
	case size == 0 || uint64(st2.Size) != size:
		return regionRefused, nil, fmt.Errorf("region of %d bytes, announced %d", st2.Size, size)
	case size > limit:
		return regionRefused, nil, fmt.Errorf("region of %d bytes, more than the %d a payload may need (--max-message-mb)", size, limit)
	}
	mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return regionMapFailed, nil, fmt.Errorf("mmap: %w", err)
	}
	return regionAccepted, mem, nil
}

// releaseRegion unmaps a connection's region once its handler is done.
func (s *Server) releaseRegion(mem []byte) {
	if mem != nil {
		unmap(mem)
		s.regions.Add(-1)
	}
}

// receivedFDs returns the descriptors in a message's control data.
func receivedFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

// serverUID is the user whose processes may hand the server a region.
func serverUID() int { return os.Geteuid() }
