package pbcodec

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/pstrain/pstrain/proto"
)

// rowBlock is a push's block of n keys with 16 values each, every byte
// of the values fill.
func rowBlock(n int, fill byte) *pb.PushRowsRequest {
	return &pb.PushRowsRequest{RunId: "run", Worker: 1, Version: 7, Tables: []*pb.RowBlock{{
		Table: "emb/C1", SmallKeys: make([]uint64, n), Values: bytes.Repeat([]byte{fill}, n*64)}}}
}

// TestMarshalIsProtobufsAndRoundTrips: what the codec writes is
// proto.Marshal's bytes, and reads back equal, for messages below and
// above the pooled size, a large buffer reused (not cleared) for a
// smaller message of its class among them.
func TestMarshalIsProtobufsAndRoundTrips(t *testing.T) {
	c := New()
	for _, tc := range []struct {
		n    int
		fill byte
	}{{1, 1}, {4000, 0xff}, {2500, 2}, {10, 3}, {70000, 4}} {
		msg := rowBlock(tc.n, tc.fill)
		data, err := c.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if got := data.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("%d keys: the codec wrote %d bytes unlike proto.Marshal's %d", tc.n, len(got), len(want))
		}
		var back pb.PushRowsRequest
		if err := c.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		data.Free() // the buffer goes back to the pool: the next message reuses it
		if !proto.Equal(&back, msg) {
			t.Fatalf("%d keys: read back a different message", tc.n)
		}
	}
}

// TestUnmarshalKeepsNoViewOfTheBuffer: a message read from several
// buffers (materialised into one of the pool) keeps its values after
// that buffer is reused.
func TestUnmarshalKeepsNoViewOfTheBuffer(t *testing.T) {
	c := New()
	wire, err := proto.Marshal(rowBlock(3000, 9))
	if err != nil {
		t.Fatal(err)
	}
	half := len(wire) / 2
	data := mem.BufferSlice{mem.SliceBuffer(wire[:half]), mem.SliceBuffer(wire[half:])}
	var got pb.PushRowsRequest
	if err := c.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	// Overwrite whatever buffer of the class the pool holds.
	b := c.pool.Get(len(wire))
	for i := range *b {
		(*b)[i] = 0
	}
	c.pool.Put(b)
	if !bytes.Equal(got.Tables[0].Values, bytes.Repeat([]byte{9}, 3000*64)) {
		t.Fatal("the message's values changed with the pool's buffer")
	}
}

// TestPoolClasses: Get gives the length asked in a power-of-two
// capacity up to 4 MiB, larger ones exactly; Put keeps only buffers of
// a class.
func TestPoolClasses(t *testing.T) {
	p := NewPool()
	for _, tc := range []struct{ n, cap int }{{1, 1}, {1000, 1024}, {1024, 1024}, {1025, 2048}, {70000, 1 << 17}, {4 << 20, 4 << 20}, {4<<20 + 1, 4<<20 + 1}} {
		b := p.Get(tc.n)
		if len(*b) != tc.n || cap(*b) != tc.cap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.n, len(*b), cap(*b), tc.n, tc.cap)
		}
		p.Put(b)
	}
	odd := make([]byte, 3000)
	p.Put(&odd) // not a class's size: dropped
	if b := p.Get(3000); cap(*b) != 4096 {
		t.Errorf("Get(3000) after a Put of 3000 bytes: cap %d, want 4096", cap(*b))
	}
	if b := p.Get(0); len(*b) != 0 {
		t.Errorf("Get(0): len %d", len(*b))
	}
}
