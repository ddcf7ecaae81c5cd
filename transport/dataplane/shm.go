package dataplane

import (
	"encoding/binary"
	"errors"
)

// Shared memory between same-host tasks: on a same-host
// (Unix) connection the client offers a shared-memory region right after
// connecting, and once the server has accepted it, pushes and pulls
// carry their payloads there instead of through the socket; the frames
// on the socket are the headers only. The kernel's socket copies (skb
// allocation, copies into and out of fresh kernel pages, a wake-up per
// piece) become two memcpys within memory both processes keep mapped and
// warm.
//
// The preamble, before any frame, all integers little-endian:
//
//	client: "PSM1" | region size u64, with the region's memfd attached
//	        (SCM_RIGHTS)
//	server: "PSM1" | status u8 (regionAccepted, or why not)
//
// or, from a client that also takes the server's shared pull answers
// (snapshots.go):
//
//	client: "PSM2" | region size u64, with the region's memfd attached
//	server: "PSM2" | status u8 | slots u8 | slot size u64, with the
//	        snapshot region's memfd attached when the status is
//	        regionAccepted and slots is not 0 (slots x slot size bytes,
//	        sealed as a client's region is; the client maps it
//	        read-only)
//
// The region is one slot: a connection has one request outstanding, so
// a push's gradient and a pull's parameters both start at offset 0, and
// a frame names only its length, which the server bounds by the region
// before it reads or writes a byte of it. A client whose region was
// refused, or whose server does not know the preamble (it answers with
// a bad-magic error in a response frame), carries the payloads on the
// socket as before. docs/wire.md has the frames' flags, docs/security.md
// what the server checks and why that suffices.

var (
	preambleMagic   = [4]byte{'P', 'S', 'M', '1'}
	preambleMagicV2 = [4]byte{'P', 'S', 'M', '2'} // the client takes shared pull answers
)

const (
	preambleLen = 4 + 8          // magic, region size
	ackLen      = 4 + 1          // magic, status
	ackLenV2    = ackLen + 1 + 8 // and slots, slot size
)

// Preamble answers (the ack's status).
const (
	regionAccepted  = 0
	regionDisabled  = 1 // the server does not use shared memory (Config.NoSharedMemory)
	regionForeign   = 2 // the client runs as another user
	regionRefused   = 3 // not a sealed memfd of the announced size within the limit
	regionMapFailed = 4 // mmap failed on the server

	// regionNotOffered is the client's own: it could not make a region
	// (memfd_create or mmap failed), sent nothing, and may try again on
	// its next connection.
	regionNotOffered = 255
)

// minRegion is the smallest region a client offers: mapped memory costs
// only the pages touched, so a region that holds a small model's shard
// whole saves reconnecting to grow it.
const minRegion = 1 << 20

// errNoPreamble: the server answered the preamble with something else
// than an ack (a server of an earlier build, which refuses it as a bad
// magic and closes the connection).
var errNoPreamble = errors.New("dataplane: the server does not take a shared-memory region")

func appendPreamble(b []byte, size int) []byte {
	b = append(b, preambleMagic[:]...)
	return binary.LittleEndian.AppendUint64(b, uint64(size))
}

func appendAck(b []byte, st byte) []byte {
	b = append(b, preambleMagic[:]...)
	return append(b, st)
}

// appendAckV2 is the ack to a "PSM2" preamble: slots slots of size
// bytes shared (0, 0: none).
func appendAckV2(b []byte, st byte, slots, size int) []byte {
	b = append(b, preambleMagicV2[:]...)
	b = append(b, st, byte(slots))
	return binary.LittleEndian.AppendUint64(b, uint64(size))
}

// regionSize rounds n up to whole pages of 64 KiB (any page size divides
// it), at least minRegion and at most the payload limit rounded alike.
func regionSize(n, maxPayload int) int {
	const page = 64 << 10
	up := func(n int) int { return (n + page - 1) / page * page }
	return min(up(max(n, minRegion)), up(max(maxPayload, 1)))
}

// sharedSnaps is a client's read-only mapping of its server's snapshot
// region (snapshots.go): slots slots of size bytes. Zero: none.
type sharedSnaps struct {
	mem         []byte
	slots, size int
}

// at is the n bytes of an answer in slot; false if they are not within
// the region.
func (s sharedSnaps) at(slot, n int) ([]byte, bool) {
	if s.mem == nil || slot < 0 || slot >= s.slots || n < 0 || n > s.size {
		return nil, false
	}
	off := slot * s.size
	return s.mem[off : off+n : off+n], true
}

// connShm is what a same-host connection shares with its server: the
// client's region (nil: none), whether the client maps the server's
// snapshot region, and the slot of it the connection's last answer is
// in (-1: none), which the server holds until the connection's next
// request.
type connShm struct {
	mem   []byte
	snaps bool
	held  int
}
