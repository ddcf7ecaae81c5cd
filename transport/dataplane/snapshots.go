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
//
// A slot may also be lent to the backend (Lend): the backend keeps a
// pull snapshot in it, writing its parameters there itself, and a pull
// answered with that buffer is answered from its slot with nothing
// copied (one copy per version instead of two: the backend's snapshot,
// then the slot). A lent slot is the backend's until it gives it back
// (Return); between pulls it is never taken for another buffer's copy.

// snapSlots is the number of slots: two versions in use at once in sync
// mode (the workers' and the next), the state the chief's evaluation
// retains, the backend's two spare snapshots (Lend), and one more.
const snapSlots = 6

// maxLent bounds the slots lent to the backend, so that a buffer of its
// own (a snapshot made when none could be lent, as with many async
// workers on different versions) still finds a slot to be copied into.
const maxLent = snapSlots - 1

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
	lent  int  // slots lent to the backend
	shut  bool // the server closed: unmap once the last lent slot is back
}

// snapSlot is one slot's state. Free: users 0, key nil, pin nil, not
// lent.
type snapSlot struct {
	key   unsafe.Pointer // the backend buffer whose copy the slot holds (nil: none yet)
	n     int            // its length
	users int            // connections whose last answer it is, or filling it
	pin   func()         // the backend's hold on the buffer key
	// lent: the slot is the backend's buffer (Lend); key, when users > 0,
	// is the slot's own memory.
	lent bool
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
		if s.users == 0 && !s.lent && free < 0 {
			free = i
		}
	}
	if i, ok := t.lentAt(key); ok {
		// The backend's snapshot is the slot: nothing to copy.
		s := &t.slots[i]
		s.users, s.key, s.n, s.pin = 1, key, len(body), release
		t.mu.Unlock()
		return i, true
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
		*s = snapSlot{lent: s.lent}
	}
	t.mu.Unlock()
	if pin != nil {
		pin()
	}
}

// lentAt is the index of the lent slot whose memory starts at key.
// Call with mu held.
func (t *snapshots) lentAt(key unsafe.Pointer) (int, bool) {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(t.mem)))
	off := uintptr(key) - base
	if uintptr(key) < base || off >= uintptr(snapSlots*t.size) || off%uintptr(t.size) != 0 {
		return 0, false
	}
	i := int(off / uintptr(t.size))
	return i, t.slots[i].lent
}

// Lend gives the backend a slot's memory for a pull snapshot of n bytes,
// to write and to answer pulls with (PullShared) until it gives it back
// with Return. false: n does not fit a slot, or no slot is free to lend
// (the backend then uses memory of its own).
func (t *snapshots) Lend(n int) ([]byte, bool) {
	if n <= 0 || n > t.size {
		return nil, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.shut || t.lent >= maxLent {
		return nil, false
	}
	for i := range t.slots {
		if s := &t.slots[i]; s.users == 0 && !s.lent {
			s.lent = true
			t.lent++
			return t.at(i, n), true
		}
	}
	return nil, false
}

// Return ends the loan of the slot b (from Lend) once no connection
// holds it; the backend no longer reads or writes b.
func (t *snapshots) Return(b []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, ok := t.lentAt(unsafe.Pointer(unsafe.SliceData(b)))
	if !ok || t.slots[i].users > 0 {
		// (A pull holding it holds the backend's hold too: the backend
		// returns a buffer only once that is released.)
		panic("dataplane: a snapshot slot given back that is not lent, or still held")
	}
	t.slots[i].lent = false
	t.lent--
	if t.shut && t.lent == 0 {
		unmap(t.mem)
	}
}

// close is the server's end of the table: its memory is unmapped now, or
// when the backend has given back every slot lent to it (it may still
// read them meanwhile, e.g. a checkpoint of its snapshot).
func (t *snapshots) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.shut = true
	if t.lent == 0 {
		unmap(t.mem)
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
