package dataplane

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
)

// fakeStandby is a Backend that records the replication batches it gets
// (copied: the server reuses their gradients' buffers) and answers them
// with answer (nil: acknowledge the batch's last operation at version
// 100 + that), or waits for its context when block is set.
type fakeStandby struct {
	fakeBackend
	batches chan *pb.ReplicaBatch
	answer  error
	block   bool
	ctxs    chan context.Context
}

func newFakeStandby() *fakeStandby {
	return &fakeStandby{fakeBackend: fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)},
		batches: make(chan *pb.ReplicaBatch, 10), ctxs: make(chan context.Context, 1)}
}

func (f *fakeStandby) Replicate(ctx context.Context, b *pb.ReplicaBatch) (*pb.ReplicaAck, error) {
	f.batches <- proto.Clone(b).(*pb.ReplicaBatch)
	if f.block {
		f.ctxs <- ctx
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if f.answer != nil {
		return nil, f.answer
	}
	last := b.FirstSeq + int64(len(b.Ops)) - 1
	return &pb.ReplicaAck{Seq: last, Version: 100 + last}, nil
}

func pushOp(worker int32, grad []byte) *pb.ReplicaOp {
	return &pb.ReplicaOp{Op: &pb.ReplicaOp_Push{Push: &pb.PushRequest{Worker: worker, Version: 7, Grad: grad, RunId: "r",
		Loss: 0.25, Generation: 2, DataPosition: 41}}}
}

// A batch of every kind of operation crosses the data plane unchanged,
// and its acknowledgement comes back.
func TestReplicateRoundTrip(t *testing.T) {
	b := newFakeStandby()
	addr, _ := startAuth(t, b, nil, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	g0, g1 := bytes.Repeat([]byte{1, 2, 3, 4}, 1000), bytes.Repeat([]byte{9, 8, 7, 6}, 1000)
	batches := []*pb.ReplicaBatch{
		{RunId: "r", Shard: 3, Epoch: 5, FirstSeq: 1, Ops: []*pb.ReplicaOp{{Op: &pb.ReplicaOp_Snapshot{Snapshot: &pb.ReplicaSnapshot{
			Init: &pb.InitRequest{RunId: "r", Shard: 3, Params: []byte{1, 2, 3, 4}, Version: 12}, ShardState: &pb.ShardState{Accepted: 1}}}}}},
		{RunId: "r", Shard: 3, Epoch: 5, FirstSeq: 2, Ops: []*pb.ReplicaOp{pushOp(0, g0), pushOp(1, g1),
			{Op: &pb.ReplicaOp_Membership{Membership: &pb.MembershipRequest{LiveWorkers: []int32{0, 2}, Members: 3, Replicas: 2, MaxVersion: 90}}},
			{Op: &pb.ReplicaOp_Retain{Retain: 41}}, {Op: &pb.ReplicaOp_Stop{Stop: &pb.StopRequest{}}}}},
		{RunId: "r", Shard: 3, Epoch: 5, FirstSeq: 7, Ops: []*pb.ReplicaOp{pushOp(1, nil)}}, // an empty gradient
		// A CTR shard's: a snapshot's rows, a worker's row pull and push.
		{RunId: "r", Shard: 3, Epoch: 5, FirstSeq: 8, Ops: []*pb.ReplicaOp{
			{Op: &pb.ReplicaOp_Rows{Rows: &pb.TableRowsChunk{Table: "emb/C1", Keys: []uint64{3, 1 << 40}, Values: g0[:16], State: g1[:16], LastSeen: []int64{7, 9}}}},
			{Op: &pb.ReplicaOp_PullRows{PullRows: &pb.PullRowsRequest{RunId: "r", Worker: 1, Generation: 2, MinVersion: 12,
				Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{5, 6}}, {Table: "emb/C2", SmallKeys: []uint64{7}}}}}},
			{Op: &pb.ReplicaOp_PushRows{PushRows: &pb.PushRowsRequest{RunId: "r", Worker: 0, Generation: 2, Version: 12,
				Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{5}, Values: g0[:8]}}}}}}},
	}
	for _, in := range batches {
		ack, err := c.Replicate(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		last := in.FirstSeq + int64(len(in.Ops)) - 1
		if ack.Seq != last || ack.Version != 100+last {
			t.Fatalf("ack %+v, want seq %d version %d", ack, last, 100+last)
		}
		if got := <-b.batches; !proto.Equal(got, in) {
			t.Fatalf("the standby got\n%v\nwant\n%v", got, in)
		}
	}
	// A push of another run than its batch's cannot be encoded.
	bad := &pb.ReplicaBatch{RunId: "r", FirstSeq: 7, Ops: []*pb.ReplicaOp{pushOp(0, g0)}}
	bad.Ops[0].GetPush().RunId = "other"
	if _, err := c.Replicate(context.Background(), bad); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a push of another run: %v, want InvalidArgument", err)
	}
}

// The standby's refusals keep their codes: Aborted (a newer epoch) is
// what deposes a primary.
func TestReplicateKeepsTheStandbysCode(t *testing.T) {
	b := newFakeStandby()
	b.answer = status.Error(codes.Aborted, "replica batch of epoch 1 refused: this process is the primary of epoch 2")
	addr, _ := startAuth(t, b, nil, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	_, err := c.Replicate(context.Background(), &pb.ReplicaBatch{RunId: "r", Epoch: 1, FirstSeq: 3, Ops: []*pb.ReplicaOp{pushOp(0, make([]byte, 8))}})
	if status.Code(err) != codes.Aborted || status.Convert(err).Message() != "replica batch of epoch 1 refused: this process is the primary of epoch 2" {
		t.Fatalf("got %v, want the standby's Aborted", err)
	}
	// A backend that applies no batches refuses them.
	plain, addr2 := start(t, 1<<20)
	d := client(addr2, 1<<20)
	defer d.Close()
	if _, err := d.Replicate(context.Background(), &pb.ReplicaBatch{RunId: "r", FirstSeq: 1, Ops: []*pb.ReplicaOp{pushOp(0, make([]byte, 8))}}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("a server without replication: %v, want Unimplemented", err)
	}
	plain.mu.Lock()
	pushes := plain.pushes
	plain.mu.Unlock()
	if pushes != 0 {
		t.Fatal("a replicate frame reached the push handler")
	}
}

// A deadline on the call ends it on the client, and the standby's
// handler sees its context cancelled when the client hangs up.
func TestReplicateDeadline(t *testing.T) {
	b := newFakeStandby()
	b.block = true
	addr, _ := startAuth(t, b, nil, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Replicate(ctx, &pb.ReplicaBatch{RunId: "r", FirstSeq: 1, Ops: []*pb.ReplicaOp{pushOp(0, make([]byte, 8))}})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a call past its deadline: %v", err)
	}
	select {
	case sctx := <-b.ctxs:
		select {
		case <-sctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the standby's handler was not cancelled when its client went away")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the batch never reached the standby")
	}
}

// Only ps/N and standby/N may send shard N's batches; anyone else is
// refused on the header, before the server reads the payload.
func TestReplicateIsForTheShardsProcessesOnly(t *testing.T) {
	b := newFakeStandby()
	keys := auth.NewKeyring(auth.Token("the run's token, thirty-two bytes or more"))
	addr, reasons := startAuth(t, b, keys, 1<<20)
	batch := &pb.ReplicaBatch{RunId: "r", Shard: 2, Epoch: 1, FirstSeq: 1, Ops: []*pb.ReplicaOp{pushOp(0, make([]byte, 64))}}
	for _, who := range []struct {
		role  string
		index int
	}{{auth.RolePS, 2}, {auth.RoleStandby, 2}} {
		c := signed(addr, keys, who.role, who.index, 1<<20)
		if _, err := c.Replicate(context.Background(), batch); err != nil {
			t.Fatalf("%s/%d replicating shard 2: %v", who.role, who.index, err)
		}
		c.Close()
		<-b.batches
	}
	for _, who := range []struct {
		role  string
		index int
	}{{auth.RoleWorker, 2}, {auth.RoleChief, 0}, {auth.RolePS, 1}, {auth.RoleStandby, 0}} {
		// The header alone, announcing a payload that never comes: the
		// refusal arrives anyway, so the server did not wait for it.
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		sender := &auth.Client{Keys: keys, Role: who.role, Index: who.index}
		sender.SetSession(uint64(1000 + who.index))
		hdr := appendSigned(nil, request{op: opReplicate, runID: "r", worker: 2, version: 1, generation: 1, dataPos: 1, payloadLen: 1 << 10}, sender)
		if _, err := conn.Write(hdr); err != nil {
			t.Fatal(err)
		}
		resp, err := readResponse(conn, make([]byte, respLen), 1<<20)
		conn.Close()
		if err != nil || codes.Code(resp.code) != codes.PermissionDenied {
			t.Fatalf("%s/%d replicating shard 2: %+v, %v; want PermissionDenied", who.role, who.index, resp, err)
		}
	}
	// Unsigned.
	c := client(addr, 1<<20)
	defer c.Close()
	if _, err := c.Replicate(context.Background(), batch); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("an unsigned batch: %v, want Unauthenticated", err)
	}
	if got := reasons(); got[auth.ReasonForbidden] != 4 || got[auth.ReasonNoCredential] != 1 {
		t.Fatalf("refusals by reason: %v", got)
	}
	select {
	case got := <-b.batches:
		t.Fatalf("a refused batch reached the standby: %v", got)
	default:
	}
}

// A payload that does not hold the operations its header announces is
// refused as InvalidArgument, and nothing reaches the backend.
func TestReplicateMalformedPayloads(t *testing.T) {
	b := newFakeStandby()
	addr, _ := startAuth(t, b, nil, 1<<20)
	op := func(kind byte, body []byte) []byte {
		out := binary.LittleEndian.AppendUint32([]byte{kind}, uint32(len(body)))
		return append(out, body...)
	}
	push := func(gradLen uint32, grad []byte) []byte {
		out := append([]byte{kindPush}, make([]byte, pushOpLen-5)...)
		out = binary.LittleEndian.AppendUint32(out, gradLen)
		return append(out, grad...)
	}
	cases := map[string]struct {
		ops     int64
		payload []byte
	}{
		"no operations":          {0, op(kindStop, nil)},
		"more than fit":          {3, op(kindStop, nil)},
		"trailing bytes":         {1, append(op(kindStop, nil), 0, 0, 0, 0, 0, 0)},
		"unknown kind":           {1, op(9, nil)},
		"body past the payload":  {1, binary.LittleEndian.AppendUint32([]byte{kindStop}, 100)},
		"gradient past the end":  {1, push(64, make([]byte, 8))},
		"not a protobuf message": {1, op(kindMembership, []byte{0xff, 0xff})},
		"a short retain":         {1, op(kindRetain, []byte{1, 2, 3})},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			frame := appendSigned(nil, request{op: opReplicate, runID: "r", dataPos: tc.ops, generation: 1, payloadLen: uint32(len(tc.payload))}, nil)
			if _, err := conn.Write(append(frame, tc.payload...)); err != nil {
				t.Fatal(err)
			}
			resp, err := readResponse(conn, make([]byte, respLen), 1<<20)
			if err != nil || codes.Code(resp.code) != codes.InvalidArgument {
				t.Fatalf("%+v, %v; want InvalidArgument", resp, err)
			}
			io.CopyN(io.Discard, conn, int64(resp.payloadLen))
		})
	}
	select {
	case got := <-b.batches:
		t.Fatalf("a malformed batch reached the standby: %v", got)
	default:
	}
}

// A same-host primary's batches travel in its connection's shared region
// and reach the standby as they do through the socket.
func TestReplicateThroughTheRegion(t *testing.T) {
	g0, g1 := bytes.Repeat([]byte{1, 2, 3, 4}, 5000), bytes.Repeat([]byte{9, 8, 7, 6}, 5000)
	in := &pb.ReplicaBatch{RunId: "r", Shard: 1, Epoch: 2, FirstSeq: 3, Ops: []*pb.ReplicaOp{pushOp(0, g0),
		{Op: &pb.ReplicaOp_Retain{Retain: 8}}, pushOp(1, g1)}}
	for _, off := range []bool{false, true} {
		b := newFakeStandby()
		s, addr := serveShm(t, b, Config{NoSharedMemory: off}, nil)
		c := client(addr, 8<<20)
		if _, err := c.Replicate(context.Background(), in); err != nil {
			t.Fatal(err)
		}
		if got := <-b.batches; !proto.Equal(got, in) {
			t.Fatalf("shared memory off %v: the standby got\n%v\nwant\n%v", off, got, in)
		}
		if used := s.inShm.Load() > 0; used == off {
			t.Fatalf("shared memory off %v: batch in the region %v", off, used)
		}
		c.Close()
	}
}
