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

// regionName and snapsName name the memfds (in /proc/PID/maps and fd
// listings): a connection's region, the server's shared pull answers.
const (
	regionName = "pstrain-dataplane"
	snapsName  = "pstrain-pulls"
)

// regionSeals are the seals the server requires: the size can change no
// more (a region shrunk under the server's mapping would fault it with
// SIGBUS) and no other seal can be added (F_SEAL_FUTURE_WRITE would stop
// the server writing pulls).
const regionSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// newRegion makes a sealed memfd of size bytes and maps it; the caller
// closes fd once it is sent and unmaps mem when done.
func newRegion(name string, size int) (mem []byte, fd int, err error) {
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
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
// size bytes, before any frame, and takes the server's shared pull
// answers (snapshots.go) if it has them. It returns the mapped region if
// the server took it, with the snapshot region (read-only; nil: none),
// or nil and the server's status if it did not (the connection goes on
// without one). An error means the connection is of no further use
// (errNoPreamble: a server of an earlier build); the caller closes it.
func offerRegion(conn *net.UnixConn, size int, deadline time.Time) (mem []byte, snaps sharedSnaps, st byte, err error) {
	mem, fd, err := newRegion(regionName, size)
	if err != nil {
		return nil, sharedSnaps{}, regionNotOffered, nil // nothing sent: carry on without
	}
	defer unix.Close(fd)
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	pre := append(preambleMagicV2[:0:0], preambleMagicV2[:]...)
	pre = binary.LittleEndian.AppendUint64(pre, uint64(size))
	if _, _, err := conn.WriteMsgUnix(pre, unix.UnixRights(fd), nil); err != nil {
		unmap(mem)
		return nil, sharedSnaps{}, 0, closedByServer(err)
	}
	ack, fds, err := readAck(conn)
	defer closeFDs(fds)
	if err != nil {
		unmap(mem)
		return nil, sharedSnaps{}, 0, err
	}
	if ack[4] != regionAccepted {
		unmap(mem)
		return nil, sharedSnaps{}, ack[4], nil
	}
	snaps, err = mapSnapshots(fds, int(ack[5]), binary.LittleEndian.Uint64(ack[6:]))
	if err != nil {
		// The server will answer pulls in a region we could not map:
		// no region at all on this connection.
		unmap(mem)
		return nil, sharedSnaps{}, 0, fmt.Errorf("%w: its snapshot region: %w", errNoPreamble, err)
	}
	return mem, snaps, regionAccepted, nil
}

// readAck reads the server's ack to a "PSM2" preamble and the
// descriptors sent with it: a "PSM2" ack, or a "PSM1" one (no shared
// answers), returned as a "PSM2" ack with no slots. A server of an
// earlier build answers with a response frame (a bad magic):
// errNoPreamble.
func readAck(conn *net.UnixConn) (ack [ackLenV2]byte, fds []int, err error) {
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(ack[:ackLen], oob)
	n, oobn = max(n, 0), max(oobn, 0)
	fds = receivedFDs(oob[:oobn])
	if err == nil && n < ackLen {
		var m int
		m, err = io.ReadFull(conn, ack[n:ackLen])
		n += m
	}
	switch {
	case n >= len(magic) && [4]byte(ack[:4]) == magic:
		return ack, fds, errNoPreamble // a response frame: a server of an earlier build
	case err != nil:
		return ack, fds, closedByServer(err) // closed before answering (a server at its connection limit)
	case [4]byte(ack[:4]) == preambleMagic:
		return ack, fds, nil // slots and size 0
	case [4]byte(ack[:4]) != preambleMagicV2:
		return ack, fds, fmt.Errorf("%w: bad ack %q", ErrBadFrame, ack[:4])
	}
	if _, err := io.ReadFull(conn, ack[ackLen:]); err != nil {
		return ack, fds, closedByServer(err)
	}
	return ack, fds, nil
}

// closeFDs closes received descriptors (a mapping needs none).
func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// mapSnapshots maps, read-only, the snapshot region a server sent with
// its ack: slots slots of size bytes, sealed as a client's region is.
// No slots: none (and no descriptor expected).
func mapSnapshots(fds []int, slots int, size uint64) (sharedSnaps, error) {
	switch {
	case slots == 0 && len(fds) == 0:
		return sharedSnaps{}, nil
	case slots == 0 || slots > snapSlots || size == 0 || size > maxSnapSlot:
		return sharedSnaps{}, fmt.Errorf("%d slots of %d bytes", slots, size)
	case len(fds) != 1:
		return sharedSnaps{}, fmt.Errorf("%d descriptors with the ack, want 1", len(fds))
	}
	total := uint64(slots) * size
	if err := checkMemfd(fds[0], total); err != nil {
		return sharedSnaps{}, err
	}
	mem, err := unix.Mmap(fds[0], 0, int(total), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return sharedSnaps{}, fmt.Errorf("mmap: %w", err)
	}
	return sharedSnaps{mem: mem, slots: slots, size: int(size)}, nil
}

// checkMemfd checks that fd is a plain memfd (on tmpfs, a regular file)
// of size bytes, sealed against resizing.
func checkMemfd(fd int, size uint64) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("not a memfd: %w", err)
	}
	if seals&regionSeals != regionSeals {
		return fmt.Errorf("region not sealed against resizing (seals %#x, want %#x)", seals, regionSeals)
	}
	// Only tmpfs pages (a plain memfd's): a hugetlbfs memfd passes the
	// checks above, but its pages can run out under the mapping, and a
	// copy into it would fault the whole process.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return fmt.Errorf("fstatfs: %w", err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("region is not on tmpfs (file system %#x): not a plain memfd", fs.Type)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return errors.New("region is not a regular file")
	case size == 0 || uint64(st.Size) != size:
		return fmt.Errorf("region of %d bytes, announced %d", st.Size, size)
	}
	return nil
}

// newServerSnapshots makes the server's snapshot region (snapshots.go):
// snapSlots slots that hold a payload of up to maxPayload bytes (at most
// maxSnapSlot), sealed, mapped read-write. fd is sent to each client
// that takes it; the caller closes it and unmaps the table's memory.
func newServerSnapshots(maxPayload int) (t *snapshots, fd int, err error) {
	slot := regionSize(min(maxPayload, maxSnapSlot), maxSnapSlot)
	mem, fd, err := newRegion(snapsName, snapSlots*slot)
	if err != nil {
		return nil, -1, err
	}
	return newSnapshots(mem), fd, nil
}

// closeSnapshots unmaps the server's snapshot region (once no slot is
// lent: snapshots.close) and closes its descriptor.
func closeSnapshots(t *snapshots, fd int) {
	if t != nil {
		t.close()
		unix.Close(fd)
	}
}

// readPreamble reads a connection's first bytes into pre, with the
// descriptors sent beside them when same (the peer is a process of our
// own user). Descriptors are taken only from such a process: closing one
// runs its file's flush, which a file on a FUSE mount a foreign process
// controls could make wait forever, holding the connection's slot and
// Close; read without room for them, the kernel drops them with no
// flush.
func readPreamble(c *net.UnixConn, pre []byte, same bool) (n int, fds []int, err error) {
	if !same {
		n, err = c.Read(pre)
		return n, nil, err
	}
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for more fds than the one expected, to close them
	n, oobn, _, _, err := c.ReadMsgUnix(pre, oob)
	// On an error (the idle deadline passing, among others) recvmsg's -1
	// comes back as n and oobn (Go's internal/poll passes it on), and
	// slicing with it crashed the PS: a connection from a process of the
	// same user that stayed silent for IdleTimeout was enough.
	n, oobn = max(n, 0), max(oobn, 0)
	return n, receivedFDs(oob[:oobn]), err
}

// takeRegion reads a same-host connection's first bytes: a client's
// preamble, which it answers (mem: the region if accepted), or the start
// of its first frame (a client that offers no region), which rd gives
// back before the rest of the connection. ok false: the connection is
// done.
func (s *Server) takeRegion(c *net.UnixConn) (mem []byte, snaps bool, rd io.Reader, ok bool) {
	c.SetReadDeadline(time.Now().Add(s.lim.IdleTimeout))
	defer c.SetReadDeadline(time.Time{})
	var pre [preambleLen]byte
	same := peerIsUser(c, s.uid)
	n, fds, err := readPreamble(c, pre[:], same)
	defer closeFDs(fds) // a mapping needs no descriptor
	if err != nil && n == 0 {
		if isTimeout(err) {
			s.cut(c, "idle", fmt.Errorf("no request for %v", s.lim.IdleTimeout))
		}
		return nil, false, nil, false
	}
	if n < len(preambleMagic) {
		// Begun, so the rest is due within FrameGrace, as a header's is.
		c.SetReadDeadline(time.Now().Add(s.lim.FrameGrace))
		m, err := io.ReadFull(c, pre[n:len(preambleMagic)])
		n += m
		if err != nil {
			return nil, false, io.MultiReader(bytes.NewReader(pre[:n]), c), true // the frame reader reports it
		}
	}
	v2 := [4]byte(pre[:4]) == preambleMagicV2
	if [4]byte(pre[:4]) != preambleMagic && !v2 {
		// A frame: whatever arrived with it is not a region.
		return nil, false, io.MultiReader(bytes.NewReader(pre[:n]), c), true
	}
	c.SetReadDeadline(time.Now().Add(s.lim.FrameGrace))
	if _, err := io.ReadFull(c, pre[n:]); err != nil {
		if isTimeout(err) {
			s.cut(c, "slow", fmt.Errorf("preamble not in within %v", s.lim.FrameGrace))
		}
		return nil, false, nil, false
	}
	size := binary.LittleEndian.Uint64(pre[4:])
	st, mem, err := s.mapRegion(same, fds, size)
	if err != nil {
		s.refusal.Warn("shm", "data plane: shared-memory region refused; payloads go through the socket", "remote", c.RemoteAddr().String(), "err", err)
	}
	snaps = v2 && mem != nil && s.snaps != nil
	if err := s.writeAck(c, v2, st, snaps); err != nil {
		unmap(mem)
		return nil, false, nil, false
	}
	if mem != nil {
		s.regions.Add(1)
	}
	return mem, snaps, c, true
}

// writeAck answers a preamble with status st: the "PSM1" ack, or to a
// "PSM2" preamble (v2) the "PSM2" ack, with the snapshot region's
// descriptor when snaps.
func (s *Server) writeAck(c *net.UnixConn, v2 bool, st byte, snaps bool) error {
	c.SetWriteDeadline(time.Now().Add(s.lim.FrameGrace))
	defer c.SetWriteDeadline(time.Time{})
	if !v2 {
		_, err := c.Write(appendAck(nil, st))
		return err
	}
	if !snaps {
		_, err := c.Write(appendAckV2(nil, st, 0, 0))
		return err
	}
	_, _, err := c.WriteMsgUnix(appendAckV2(nil, st, snapSlots, s.snaps.size), unix.UnixRights(s.snapFD), nil)
	return err
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
	if err := checkMemfd(fd, size); err != nil {
		return regionRefused, nil, err
	}
	if limit := uint64(regionSize(s.cfg.MaxPayload, s.cfg.MaxPayload)); size > limit {
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
