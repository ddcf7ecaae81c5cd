package dataplane

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	pb "github.com/pstrain/pstrain/proto"
)

// holds counts a backend buffer's holds: taken, and released.
type holds struct {
	mu             sync.Mutex
	taken, dropped int
}

func (h *holds) take() func() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.taken++
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.dropped++
	}
}

func (h *holds) outstanding() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.taken - h.dropped
}

// The same buffer is copied once and shared; the backend's hold is kept
// until the last connection holding the slot moves on, and the slot is
// then free for another buffer.
func TestSnapshotsShareOneCopyPerBuffer(t *testing.T) {
	t.Parallel()
	tab := newSnapshots(make([]byte, snapSlots*64))
	a, b := bytes.Repeat([]byte{1}, 64), bytes.Repeat([]byte{2}, 48)
	var ha, hb holds
	s1, ok1 := tab.share(a, ha.take())
	s2, ok2 := tab.share(a, ha.take())
	if !ok1 || !ok2 || s1 != s2 {
		t.Fatalf("two pulls of one buffer: slots %d %v, %d %v; want one slot", s1, ok1, s2, ok2)
	}
	if ha.outstanding() != 1 || !bytes.Equal(tab.at(s1, len(a)), a) {
		t.Fatalf("holds outstanding %d, want 1 (the slot's); slot holds the buffer: %v", ha.outstanding(), bytes.Equal(tab.at(s1, len(a)), a))
	}
	s3, ok3 := tab.share(b, hb.take())
	if !ok3 || s3 == s1 || !bytes.Equal(tab.at(s3, len(b)), b) {
		t.Fatalf("another buffer: slot %d %v, want a slot of its own holding it", s3, ok3)
	}
	tab.drop(s1)
	if ha.outstanding() != 1 {
		t.Fatal("the backend's hold ended while a connection still holds the slot")
	}
	tab.drop(s1)
	if ha.outstanding() != 0 || tab.inUse() != 1 {
		t.Fatalf("after the last drop: holds outstanding %d, slots in use %d; want 0, 1", ha.outstanding(), tab.inUse())
	}
	// a's bytes are no longer promised: a pull of the same address is
	// copied again.
	a[0] = 9
	s4, ok4 := tab.share(a, ha.take())
	if !ok4 || tab.at(s4, 1)[0] != 9 {
		t.Fatalf("a freed slot matched a buffer it no longer holds (slot %d %v)", s4, ok4)
	}
}

// Too large, empty or with every slot held: not shared, and the hold is
// left to the caller.
func TestSnapshotsRefuseWhatTheyCannotHold(t *testing.T) {
	t.Parallel()
	tab := newSnapshots(make([]byte, snapSlots*64))
	var h holds
	if _, ok := tab.share(make([]byte, 65), h.take()); ok {
		t.Fatal("a buffer larger than a slot was shared")
	}
	if _, ok := tab.share(nil, h.take()); ok {
		t.Fatal("an empty answer was shared")
	}
	for i := range snapSlots {
		if _, ok := tab.share(make([]byte, 8), h.take()); !ok {
			t.Fatalf("buffer %d not shared with free slots", i)
		}
	}
	if _, ok := tab.share(make([]byte, 8), h.take()); ok {
		t.Fatal("shared with every slot held")
	}
	if got := h.outstanding(); got != snapSlots+3 {
		t.Fatalf("%d holds outstanding, want %d: the refused three are the caller's", got, snapSlots+3)
	}
}

// heldBackend answers every pull with one buffer and counts its holds.
type heldBackend struct {
	echoBackend
	h holds
}

func (b *heldBackend) PullShared(ctx context.Context, r *pb.PullRequest) (*pb.PullResponse, func(), error) {
	resp, _, err := b.echoBackend.PullShared(ctx, r)
	return resp, b.h.take(), err
}

// Same-host clients pulling the same parameters get views of one copy
// in the server's snapshot region; the server keeps the backend's hold
// until each client's next request, and releases everything when they
// close.
func TestSameHostPullsShareOneCopy(t *testing.T) {
	const n = 4096
	b := &heldBackend{echoBackend: echoBackend{params: bytes.Repeat([]byte{5}, n)}}
	s, addr := serveShm(t, b, Config{}, nil)
	if s.snaps == nil {
		t.Skip("no shared memory on this platform")
	}
	ctx := context.Background()
	c1, c2 := client(addr, 8<<20), client(addr, 8<<20)
	v1, err1 := c1.PullView(ctx, &pb.PullRequest{RunId: "r"}, nil)
	v2, err2 := c2.PullView(ctx, &pb.PullRequest{RunId: "r"}, nil)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if !bytes.Equal(v1.Params, b.params) || !bytes.Equal(v2.Params, b.params) {
		t.Fatal("a view differs from the parameters")
	}
	if s.snaps.inUse() != 1 || b.h.outstanding() != 1 {
		t.Fatalf("%d slots in use, %d holds; want 1 slot for both and its hold", s.snaps.inUse(), b.h.outstanding())
	}
	// PullInto copies out of the slot.
	dst := [][]float32{make([]float32, n/8), make([]float32, n/8)}
	if _, err := c1.PullInto(ctx, &pb.PullRequest{RunId: "r"}, dst); err != nil || !bytes.Equal(flat(dst), b.params) {
		t.Fatalf("PullInto from a shared slot: %v, equal %v", err, bytes.Equal(flat(dst), b.params))
	}
	c1.Close()
	c2.Close()
	eventually(t, "every hold released once the clients are gone", func() bool {
		return b.h.outstanding() == 0 && s.snaps.inUse() == 0
	})
}

// versionsBackend answers pulls with the buffer of the current version,
// one of two it alternates between (a new version each step, as a sync
// shard's; neither is written, so the holds need no counting).
type versionsBackend struct {
	mu      sync.Mutex
	bufs    [2][]byte
	version int64
}

func (b *versionsBackend) PullShared(context.Context, *pb.PullRequest) (*pb.PullResponse, func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &pb.PullResponse{Version: b.version, Params: b.bufs[b.version%2]}, func() {}, nil
}

func (b *versionsBackend) Push(context.Context, *pb.PushRequest) (*pb.PushResponse, error) {
	return &pb.PushResponse{}, nil
}

func (b *versionsBackend) next() {
	b.mu.Lock()
	b.version++
	b.mu.Unlock()
}

// BenchmarkPullsOfOneVersion: a step's pulls of a default shard (318,405
// values) by two same-host workers, each reading the answer where it
// arrived (PullView), answered in each connection's region ("region")
// or from one shared copy ("shared").
func BenchmarkPullsOfOneVersion(b *testing.B) {
	const n = 318405 * 4
	for _, mode := range []string{"region", "shared"} {
		b.Run(mode, func(b *testing.B) {
			back := &versionsBackend{bufs: [2][]byte{bytes.Repeat([]byte{1}, n), bytes.Repeat([]byte{2}, n)}}
			var setup func(*Server)
			if mode == "region" {
				setup = noSnapshots
			}
			_, addr := serveShm(b, back, Config{}, setup)
			ctx := context.Background()
			cs := []*Client{client(addr, 8<<20), client(addr, 8<<20)}
			defer cs[0].Close()
			defer cs[1].Close()
			b.SetBytes(2 * n)
			b.ResetTimer()
			for range b.N {
				back.next()
				for _, c := range cs {
					if _, err := c.PullView(ctx, &pb.PullRequest{RunId: "r"}, nil); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// A connection holding a snapshot slot is not cut for idleness: its
// client may still read its last answer in place, and the cut would
// free the slot under it. One without a slot is cut as before.
func TestIdleCutSparesAHeldSlot(t *testing.T) {
	const n = 4096
	want := bytes.Repeat([]byte{7}, n)
	b := &heldBackend{echoBackend: echoBackend{params: bytes.Clone(want)}}
	s, addr := serveShm(t, b, Config{Limits: Limits{IdleTimeout: 100 * time.Millisecond}}, nil)
	if s.snaps == nil {
		t.Skip("no shared memory on this platform")
	}
	ctx := context.Background()
	holder, other := client(addr, 8<<20), client(addr, 8<<20)
	defer holder.Close()
	defer other.Close()
	v, err := holder.PullView(ctx, &pb.PullRequest{RunId: "r"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Push(ctx, &pb.PushRequest{RunId: "r", Grad: make([]byte, 64)}); err != nil {
		t.Fatal(err)
	}
	conns := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns)
	}
	// The push's connection, idle since after the pull, is cut ...
	eventually(t, "the idle connection without a slot cut", func() bool { return conns() == 1 })
	// ... and the holder's, idle at least as long, is not: its slot and
	// the backend's hold stay, with the parameters it was answered.
	if s.snaps.inUse() != 1 || b.h.outstanding() != 1 || !bytes.Equal(v.Params, want) {
		t.Fatalf("slots in use %d, holds %d, view intact %v; want the holder's slot kept", s.snaps.inUse(), b.h.outstanding(), bytes.Equal(v.Params, want))
	}
}

// A lent slot is the backend's buffer: a pull of it is answered from the
// slot with nothing copied, it is never taken for another buffer's copy,
// and it stays lent after the last connection holding it moves on, until
// the backend gives it back.
func TestLentSlotsAnswerWithoutACopy(t *testing.T) {
	t.Parallel()
	tab := newSnapshots(make([]byte, snapSlots*64))
	var lent [][]byte
	for range maxLent {
		b, ok := tab.Lend(40)
		if !ok || len(b) != 40 {
			t.Fatalf("loan %d refused with slots free", len(lent))
		}
		lent = append(lent, b)
	}
	if _, ok := tab.Lend(40); ok {
		t.Fatalf("more than %d slots lent", maxLent)
	}
	if _, ok := tab.Lend(65); ok {
		t.Fatal("a buffer larger than a slot was lent")
	}
	b := lent[1]
	copy(b, bytes.Repeat([]byte{5}, 40))
	var h holds
	s1, ok1 := tab.share(b, h.take())
	s2, ok2 := tab.share(b, h.take())
	if !ok1 || !ok2 || s1 != s2 || &tab.at(s1, 40)[0] != &b[0] {
		t.Fatalf("pulls of a lent buffer: slots %d %v, %d %v; want the buffer's own slot", s1, ok1, s2, ok2)
	}
	if h.outstanding() != 1 {
		t.Fatalf("%d holds outstanding, want 1 (the slot's)", h.outstanding())
	}
	// The slots not lent still take copies of other buffers, and a copy
	// never lands in a lent slot.
	for i := range snapSlots - maxLent {
		other := bytes.Repeat([]byte{9}, 40)
		if s, ok := tab.share(other, h.take()); !ok || tab.slots[s].lent {
			t.Fatalf("copy %d: slot %d %v; want a slot not lent", i, s, ok)
		}
	}
	if _, ok := tab.share(bytes.Repeat([]byte{9}, 40), h.take()); ok {
		t.Fatal("a copy took a lent slot")
	}
	for _, l := range lent {
		if l[0] != 0 && &l[0] != &b[0] {
			t.Fatal("a lent slot was written by a copy")
		}
	}
	tab.drop(s1)
	tab.drop(s1)
	if h.outstanding() != snapSlots-maxLent+1 || !tab.slots[s1].lent {
		t.Fatalf("after the last drop: %d holds outstanding, slot lent %v; want the copies' and the refused one's, and still lent",
			h.outstanding(), tab.slots[s1].lent)
	}
	tab.Return(b)
	if _, ok := tab.Lend(40); !ok {
		t.Fatal("a slot given back cannot be lent again")
	}
}

// The server's region stays mapped while a slot is lent after Close: the
// backend may still read its snapshot (a checkpoint of it); the last
// Return unmaps it.
func TestLentSlotsOutliveClose(t *testing.T) {
	t.Parallel()
	tab, fd, err := newServerSnapshots(1 << 16)
	if err != nil {
		t.Skipf("no shared memory here: %v", err)
	}
	b, ok := tab.Lend(1 << 16)
	if !ok {
		t.Fatal("no loan from a new region")
	}
	b[len(b)-1] = 7
	closeSnapshots(tab, fd)
	if _, ok := tab.Lend(8); ok {
		t.Fatal("a closed region lent a slot")
	}
	if b[len(b)-1] != 7 { // (a fault if it were unmapped)
		t.Fatal("a lent slot changed")
	}
	tab.Return(b)
	if tab.lent != 0 {
		t.Fatalf("%d slots still lent", tab.lent)
	}
}

// A backend that keeps its parameters in a buffer the server lends
// (SnapshotBuffers) has same-host pulls answered from that very memory:
// the clients' views are of the buffer, not of a copy of it.
func TestSameHostPullsOfALentBuffer(t *testing.T) {
	const n = 4096
	b := &heldBackend{}
	s, addr := serveShm(t, b, Config{}, nil)
	if s.snaps == nil {
		t.Skip("no shared memory on this platform")
	}
	buf, ok := s.SnapshotBuffers().Lend(n)
	if !ok {
		t.Fatal("no loan from the server's region")
	}
	copy(buf, bytes.Repeat([]byte{5}, n))
	b.params = buf
	ctx := context.Background()
	c := client(addr, 8<<20)
	defer c.Close()
	v, err := c.PullView(ctx, &pb.PullRequest{RunId: "r"}, nil)
	if err != nil || !bytes.Equal(v.Params, buf) {
		t.Fatalf("view of a lent buffer: %v, equal %v", err, err == nil && bytes.Equal(v.Params, buf))
	}
	buf[0] = 6 // (no backend writes a held buffer; this shows where the view is)
	if v.Params[0] != 6 {
		t.Fatal("the client's view is a copy of the lent buffer, not the buffer")
	}
	if s.snaps.inUse() != 1 || b.h.outstanding() != 1 {
		t.Fatalf("%d slots in use, %d holds; want the lent slot and its hold", s.snaps.inUse(), b.h.outstanding())
	}
}
