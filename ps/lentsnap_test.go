package ps

import (
	"context"
	"slices"
	"testing"
	"unsafe"

	pb "github.com/pstrain/pstrain/proto"
)

// fakeLender lends buffers of one arena, at most max at once, and
// records what is out.
type fakeLender struct {
	max  int
	out  map[*byte]bool
	lent int // loans made, in all
}

func (f *fakeLender) Lend(n int) ([]byte, bool) {
	if len(f.out) >= f.max {
		return nil, false
	}
	b := make([]byte, n)
	f.out[unsafe.SliceData(b)] = true
	f.lent++
	return b, true
}

func (f *fakeLender) Return(b []byte) {
	if !f.out[unsafe.SliceData(b)] {
		panic("a buffer given back that is not out")
	}
	delete(f.out, unsafe.SliceData(b))
}

// A server given snapshot buffers keeps its snapshots in them, reuses
// them as it does its own, answers a gRPC pull with a copy (a lent buffer
// must go back, and gRPC never says when it is done), makes its own
// buffer when none is lent, and gives every unheld buffer back.
func TestSnapshotsInLentBuffers(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	f := &fakeLender{max: 3, out: map[*byte]bool{}}
	srv.UseSnapshotBuffers(f)
	ctx := context.Background()
	pull := func(v int64) (*pb.PullResponse, func()) { t.Helper(); return pullShared(t, srv, v) }
	step := func(v int64) { t.Helper(); syncStep(t, srv, v, 1, n) }
	isLent := func(b []byte) bool { return f.out[unsafe.SliceData(b)] }

	p0, rel0 := pull(0)
	if !isLent(p0.Params) {
		t.Fatal("the first snapshot is not in a lent buffer")
	}
	g, err := srv.Pull(ctx, &pb.PullRequest{Worker: 0, MinVersion: 0, RunId: "r", Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if isLent(g.Params) || !slices.Equal(g.Params, p0.Params) {
		t.Fatal("a gRPC pull was answered with the lent buffer itself, or with other bytes")
	}
	step(0)
	p1, rel1 := pull(1)
	step(1)
	p2, rel2 := pull(2)
	step(2)
	p3, rel3 := pull(3) // three lent and held: the fourth is the heap's
	if !isLent(p1.Params) || !isLent(p2.Params) || isLent(p3.Params) || f.lent != 3 {
		t.Fatalf("lent: %v %v %v, loans %d; want the first three lent, then none", isLent(p1.Params), isLent(p2.Params), isLent(p3.Params), f.lent)
	}
	rel0()
	rel1()
	rel2()
	step(3)
	p4, rel4 := pull(4) // a spare lent buffer is reused, not lent again
	if !isLent(p4.Params) || f.lent != 3 {
		t.Fatalf("version 4: lent %v, loans %d; want a spare lent buffer reused", isLent(p4.Params), f.lent)
	}
	// Spares: two kept, so one of the three lent went back at once.
	if len(f.out) != 3-1 {
		t.Fatalf("%d buffers out with 4 held and two spares; want 2", len(f.out))
	}
	srv.ReturnSnapshotBuffers()
	if len(f.out) != 1 {
		t.Fatalf("%d buffers out after ReturnSnapshotBuffers with one lent snapshot held; want 1", len(f.out))
	}
	rel3()
	rel4() // the held one goes back with its last hold
	if len(f.out) != 0 {
		t.Fatalf("%d buffers still out once nothing holds them", len(f.out))
	}
	step(4)
	p5, rel5 := pull(5)
	defer rel5()
	if isLent(p5.Params) || f.lent != 3 {
		t.Fatal("a snapshot was lent after ReturnSnapshotBuffers")
	}
}

// In a sync run's steady state (two workers, each holding its last pull
// until its next, and the chief's evaluation pull every few steps
// retaining its version), three lent buffers are enough (the data plane
// lends up to five): every version's snapshot is in one, none is made on
// the heap (whose versions the data plane would copy into a slot again).
func TestThreeLentBuffersServeASyncRun(t *testing.T) {
	srv, _, n := newSyncServer(t, 1)
	f := &fakeLender{max: 3, out: map[*byte]bool{}}
	srv.UseSnapshotBuffers(f)
	ctx := context.Background()
	held := map[int32]func(){}
	pull := func(w int32, v int64, retain bool) {
		t.Helper()
		if rel := held[w]; rel != nil {
			rel() // (a connection's hold ends with its next request)
		}
		resp, release, err := srv.PullShared(ctx, &pb.PullRequest{Worker: w, MinVersion: v, RunId: "r", Generation: 1, Retain: retain})
		if err != nil {
			t.Fatal(err)
		}
		held[w] = release
		if !f.out[unsafe.SliceData(resp.Params)] {
			t.Fatalf("version %d's snapshot (pulled by %d) is not in a lent buffer", resp.Version, w)
		}
	}
	for v := range int64(40) {
		pull(0, v, false)
		pull(1, v, false)
		if v%3 == 0 {
			pull(-1, 0, true) // the chief's evaluation
		}
		push(t, srv, 0, v, 1, n)
		push(t, srv, 1, v, 1, n)
	}
}

// TestRetainedBeingWrittenGoesBackAfterClose: the retained state a
// checkpoint is writing when the buffers are asked back goes back once
// the checkpoint ends (it stayed out, and the region stayed mapped).
func TestRetainedBeingWrittenGoesBackAfterClose(t *testing.T) {
	srv, _, _ := newSyncServer(t, 1)
	f := &fakeLender{max: 3, out: map[*byte]bool{}}
	srv.UseSnapshotBuffers(f)
	resp, release, err := srv.PullShared(context.Background(), &pb.PullRequest{Worker: -1, MinVersion: 0, RunId: "r", Generation: 1, Retain: true})
	if err != nil {
		t.Fatal(err)
	}
	if !f.out[unsafe.SliceData(resp.Params)] {
		t.Fatal("the retained snapshot is not in a lent buffer")
	}
	srv.mu.Lock()
	r, err := srv.holdRetained(0)
	srv.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	srv.ReturnSnapshotBuffers()
	release()
	srv.mu.Lock()
	srv.unhold(r.held) // the checkpoint's hold on the parameters
	srv.mu.Unlock()
	srv.releaseRetained(r)
	if len(f.out) != 0 {
		t.Fatalf("%d lent buffers never returned", len(f.out))
	}
}
