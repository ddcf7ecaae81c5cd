package dataplane

import (
	"sync"
	"unsafe"
)

// Pull answers shared by every same-host connection of a server. A
// connection's own region (shm.go) holds one answer, written per pull:
// in sync mode every worker pulls the same version, so the server wrote
// the same parameters once per worker and step. The server has one more
// region, of a few slots, that it maps read-write and hands each
// same-host client read-only with its preamble's ack; a pull whose
// parameters are already in a slot is answered with the slot's index
// and nothing is copied, and one whose are not is copied into a free
// slot once, for every connection that pulls the same parameters after.
//
// A slot holds a copy of a backend's parameter buffer, identified by its
// address, and keeps the backend's hold on that buffer (the release
// PullShared returned) for as long as any connection's last answer is
// the slot. The Backend contract says a held buffer is not written, so
// while the slot holds it, an answer naming the same buffer has the
// same bytes as the slot. A connection's hold on its slot ends with its
// next request (the client reads an answer only until its next call,
// the rule the connection's own region keeps) or when it closes; the
// last hold to end releases the backend's, and the slot is free.
//
// When every slot is held (more versions in use at once than slots, as
// with many async workers) or the parameters are larger than a slot, a
// pull is answered in the connection's own region as before.

// snapSlots is the number of slots: two versions in use at once in sync
// mode (the workers' and the next), the chief's evaluation and one more.
const snapSlots = 4

// maxSnapSlot bounds a slot: larger parameters go through the
// connection's region.
const maxSnapSlot = 64 << 20

// snapshots is a server's table of shared pull answers over mem, slots
// of size bytes each.
type snapshots struct {
	mem  []byte
	size int

	mu    sync.Mutex
	slots [snapSlots]snapSlot
}

// snapSlot is one slot's state. Free: users 0, key nil, pin nil.
type snapSlot struct {
	key   unsafe.Pointer // the backend buffer whose copy the slot holds (nil: none yet)
	n     int            // its length
	users int            // connections whose last answer it is, or filling it
	pin   func()         // the backend's hold on the buffer key
}

// newSnapshots returns a table over mem, cut into snapSlots slots.
func newSnapshots(mem []byte) *snapshots {
	return &snapshots{mem: mem, size: len(mem) / snapSlots}
}

// share answers a pull of body (a backend buffer held by release) from
// a slot: the slot's index, and the connection now holds the slot (end
// it with drop). release is taken over: called now when another slot's
// hold already covers body, or kept as the slot's pin. ok false: no
// slot could take it (too large, empty, or every slot in use); release
// is untouched and the caller answers otherwise.
func (t *snapshots) share(body []byte, release func()) (slot int, ok bool) {
	if len(body) == 0 || len(body) > t.size {
		return 0, false
	}
	key := unsafe.Pointer(unsafe.SliceData(body))
	t.mu.Lock()
	free := -1
	for i := range t.slots {
		s := &t.slots[i]
		if s.key == key && s.n == len(body) && s.users > 0 {
			s.users++
			t.mu.Unlock()
			release()
			return i, true
		}
		if s.users == 0 && free < 0 {
			free = i
		}
	}
	if free < 0 {
		t.mu.Unlock()
		return 0, false
	}
	t.slots[free].users = 1 // reserved while it is filled: nobody matches a nil key
	t.mu.Unlock()
	copy(t.mem[free*t.size:], body)
	t.mu.Lock()
	t.slots[free].key, t.slots[free].n, t.slots[free].pin = key, len(body), release
	t.mu.Unlock()
	return free, true
}

// drop ends one connection's hold on slot; the last one releases the
// backend's buffer and frees the slot.
func (t *snapshots) drop(slot int) {
	t.mu.Lock()
	s := &t.slots[slot]
	s.users--
	var pin func()
	if s.users == 0 {
		pin = s.pin
		*s = snapSlot{}
	}
	t.mu.Unlock()
	if pin != nil {
		pin()
	}
}

// at is slot's bytes.
func (t *snapshots) at(slot, n int) []byte {
	off := slot * t.size
	return t.mem[off : off+n : off+n]
}

// inUse is the number of slots held (tests).
func (t *snapshots) inUse() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, s := range t.slots {
		if s.users > 0 {
			n++
		}
	}
	return n
}
