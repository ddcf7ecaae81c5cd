package dataplane

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/pstrain/pstrain/proto"
)

// Replication batches (hot standbys, docs/replication.md): a primary
// sends its standby the updates it applied as op 3 frames, the same
// request and response headers as a push, with the header's fields
// carrying the batch:
//
//	request:  worker = shard, version = epoch, generation = first_seq,
//	          data position = number of operations, loss = 0, no flags;
//	          payload = the operations, one after the other:
//	            push:  2 u8 | worker i32 | version i64 | generation i64 |
//	                   loss f32 | data position i64 | gradient length u32 |
//	                   gradient (raw, as the worker pushed it)
//	            other: kind u8 (1 snapshot, 3 membership, 4 stop) |
//	                   length u32 | the protobuf encoding of that message
//	                   (ReplicaSnapshot, MembershipRequest, StopRequest)
//	            retain: 5 u8 | length u32 (8) | the retained version i64
//	response: version = the standby's version (ReplicaAck.version),
//	          data position = the last operation applied (ReplicaAck.seq),
//	          no payload (an error: its message)
//
// A replicated push carries no run id: the primary forwards only pushes
// of its run, so it is the frame's. Its gradient is written from the
// primary's queue as it is (writev) and read on the standby into a
// buffer of the push budget, which the standby's shard reads and the
// server reuses once the batch is answered: the bytes are copied once
// on each side, by the kernel, where gRPC's Replicate copies them into
// protobuf messages and HTTP/2 frames on both. The sender's session
// must be ps/N or standby/N of the frame's shard N (auth.AllowReplicate),
// checked with its MAC before any of the payload is read.

// Operation kinds in a replicate payload (the ReplicaOp oneof's field
// numbers).
const (
	kindSnapshot   = 1
	kindPush       = 2
	kindMembership = 3
	kindStop       = 4
	kindRetain     = 5
)

const (
	pushOpLen  = 1 + 4 + 8 + 8 + 4 + 8 + 4 // kind ... gradient length
	otherOpLen = 1 + 4                     // kind, length
)

// Replicator is a Backend that also applies a primary's replication
// batches (*ps.Server does). A server whose backend is not one refuses
// op 3 as Unimplemented.
type Replicator interface {
	Replicate(context.Context, *pb.ReplicaBatch) (*pb.ReplicaAck, error)
}

// Replicate is ParameterServerClient.Replicate over the data plane: the
// batch's pushes are written from their gradients as they are, not
// copied. Errors are the standby's status codes (Aborted: a newer epoch
// refused the batch), Unavailable for a connection that breaks, and the
// context's for a deadline or cancellation.
func (c *Client) Replicate(ctx context.Context, in *pb.ReplicaBatch, _ ...grpc.CallOption) (*pb.ReplicaAck, error) {
	payload, err := encodeOps(in.RunId, in.Ops)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "replica batch: %v", err)
	}
	resp, _, err := c.call(ctx, request{op: opReplicate, runID: in.RunId, worker: in.Shard, version: in.Epoch,
		generation: in.FirstSeq, dataPos: int64(len(in.Ops))}, payload, nil, false)
	if err != nil {
		return nil, err
	}
	return &pb.ReplicaAck{Seq: resp.dataPosition, Version: resp.version}, nil
}

// encodeOps lays out ops as a replicate payload: their headers in one
// buffer, each push's gradient as its own slice.
func encodeOps(runID string, ops []*pb.ReplicaOp) (net.Buffers, error) {
	var hdrs []byte
	ends := make([]int, len(ops))      // where each operation's header ends in hdrs
	bodies := make([][]byte, len(ops)) // what follows it
	for i, op := range ops {
		var err error
		if hdrs, bodies[i], err = appendOp(hdrs, runID, op); err != nil {
			return nil, fmt.Errorf("operation %d: %w", i, err)
		}
		ends[i] = len(hdrs)
	}
	out := make(net.Buffers, 0, 2*len(ops))
	start := 0
	for i, end := range ends {
		out = append(out, hdrs[start:end])
		if len(bodies[i]) > 0 {
			out = append(out, bodies[i])
		}
		start = end
	}
	return out, nil
}

// appendOp appends op's header to b and returns the bytes that follow it.
func appendOp(b []byte, runID string, op *pb.ReplicaOp) ([]byte, []byte, error) {
	var m proto.Message
	kind := byte(0)
	switch x := op.GetOp().(type) {
	case *pb.ReplicaOp_Push:
		p := x.Push
		if p.GetRunId() != runID {
			return b, nil, fmt.Errorf("a push of run %q in a batch of run %q", p.GetRunId(), runID)
		}
		b = append(b, kindPush)
		b = binary.LittleEndian.AppendUint32(b, uint32(p.Worker))
		b = binary.LittleEndian.AppendUint64(b, uint64(p.Version))
		b = binary.LittleEndian.AppendUint64(b, uint64(p.Generation))
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(p.Loss))
		b = binary.LittleEndian.AppendUint64(b, uint64(p.DataPosition))
		return binary.LittleEndian.AppendUint32(b, uint32(len(p.Grad))), p.Grad, nil
	case *pb.ReplicaOp_Snapshot:
		kind, m = kindSnapshot, x.Snapshot
	case *pb.ReplicaOp_Membership:
		kind, m = kindMembership, x.Membership
	case *pb.ReplicaOp_Stop:
		kind, m = kindStop, x.Stop
	case *pb.ReplicaOp_Retain:
		b = binary.LittleEndian.AppendUint32(append(b, kindRetain), 8)
		return b, binary.LittleEndian.AppendUint64(nil, uint64(x.Retain)), nil
	default:
		return b, nil, errors.New("an empty operation")
	}
	body, err := proto.Marshal(m)
	if err != nil {
		return b, nil, err
	}
	b = append(b, kind)
	return binary.LittleEndian.AppendUint32(b, uint32(len(body))), body, nil
}

// readOps reads a replicate frame's payload: req's operations, within
// its payload length. A push's gradient goes into a buffer from
// gradBuf, returned in held for the caller to release (also on error);
// a malformed payload is ErrBadFrame, and gradBuf's errors are returned
// as they are.
func readOps(rd io.Reader, req request, gradBuf func(n int) ([]byte, error)) (b *pb.ReplicaBatch, held [][]byte, err error) {
	left := int64(req.payloadLen)
	if req.dataPos < 1 || req.dataPos > left/otherOpLen {
		return nil, nil, fmt.Errorf("%w: %d operations in %d bytes", ErrBadFrame, req.dataPos, left)
	}
	b = &pb.ReplicaBatch{RunId: req.runID, Shard: req.worker, Epoch: req.version, FirstSeq: req.generation,
		Ops: make([]*pb.ReplicaOp, 0, req.dataPos)}
	var h [pushOpLen]byte
	take := func(n int64) ([]byte, error) { // the next n header bytes
		if n > left {
			return nil, fmt.Errorf("%w: operation %d runs past the payload", ErrBadFrame, len(b.Ops))
		}
		left -= n
		_, err := io.ReadFull(rd, h[:n])
		return h[:n], err
	}
	for int64(len(b.Ops)) < req.dataPos {
		k, err := take(1)
		if err != nil {
			return nil, held, err
		}
		var op *pb.ReplicaOp
		if k[0] == kindPush {
			var grad []byte
			op, grad, err = readPushOp(req.runID, take, func(n int64) ([]byte, error) {
				if n > left {
					return nil, fmt.Errorf("%w: a gradient of %d bytes runs past the payload", ErrBadFrame, n)
				}
				left -= n
				return gradBuf(int(n))
			}, rd)
			if grad != nil {
				held = append(held, grad)
			}
		} else {
			op, err = readOtherOp(k[0], take, rd, &left)
		}
		if err != nil {
			return nil, held, err
		}
		b.Ops = append(b.Ops, op)
	}
	if left != 0 {
		return nil, held, fmt.Errorf("%w: %d bytes after the last operation", ErrBadFrame, left)
	}
	return b, held, nil
}

// readPushOp reads a push operation after its kind byte; the gradient
// goes into a buffer from grad (returned even if reading it fails).
func readPushOp(runID string, take func(int64) ([]byte, error), grad func(int64) ([]byte, error), rd io.Reader) (*pb.ReplicaOp, []byte, error) {
	f, err := take(pushOpLen - 1)
	if err != nil {
		return nil, nil, err
	}
	p := &pb.PushRequest{RunId: runID,
		Worker:       int32(binary.LittleEndian.Uint32(f[0:])),
		Version:      int64(binary.LittleEndian.Uint64(f[4:])),
		Generation:   int64(binary.LittleEndian.Uint64(f[12:])),
		Loss:         math.Float32frombits(binary.LittleEndian.Uint32(f[20:])),
		DataPosition: int64(binary.LittleEndian.Uint64(f[24:]))}
	buf, err := grad(int64(binary.LittleEndian.Uint32(f[32:])))
	if err != nil {
		return nil, nil, err
	}
	if _, err := io.ReadFull(rd, buf); err != nil {
		return nil, buf, err
	}
	p.Grad = buf
	return &pb.ReplicaOp{Op: &pb.ReplicaOp_Push{Push: p}}, buf, nil
}

// readOtherOp reads a snapshot, membership or stop operation after its
// kind byte, k.
func readOtherOp(k byte, take func(int64) ([]byte, error), rd io.Reader, left *int64) (*pb.ReplicaOp, error) {
	op := &pb.ReplicaOp{}
	var m proto.Message
	switch k {
	case kindSnapshot:
		x := &pb.ReplicaSnapshot{}
		op.Op, m = &pb.ReplicaOp_Snapshot{Snapshot: x}, x
	case kindMembership:
		x := &pb.MembershipRequest{}
		op.Op, m = &pb.ReplicaOp_Membership{Membership: x}, x
	case kindStop:
		x := &pb.StopRequest{}
		op.Op, m = &pb.ReplicaOp_Stop{Stop: x}, x
	case kindRetain:
	default:
		return nil, fmt.Errorf("%w: unknown operation kind %d", ErrBadFrame, k)
	}
	f, err := take(otherOpLen - 1)
	if err != nil {
		return nil, err
	}
	n := int64(binary.LittleEndian.Uint32(f))
	if n > *left {
		return nil, fmt.Errorf("%w: an operation of %d bytes runs past the payload", ErrBadFrame, n)
	}
	if k == kindRetain && n != 8 {
		return nil, fmt.Errorf("%w: a retain operation of %d bytes, not 8", ErrBadFrame, n)
	}
	*left -= n
	body := make([]byte, n) // bounded by the payload's length, which the server checked against MaxPayload
	if _, err := io.ReadFull(rd, body); err != nil {
		return nil, err
	}
	if k == kindRetain {
		op.Op = &pb.ReplicaOp_Retain{Retain: int64(binary.LittleEndian.Uint64(body))}
		return op, nil
	}
	if err := proto.Unmarshal(body, m); err != nil {
		return nil, fmt.Errorf("%w: operation kind %d: %v", ErrBadFrame, k, err)
	}
	return op, nil
}

// replicate reads a replicate frame's operations (its pushes' gradients
// into buffers of the budget, within the frame's time), has the backend
// apply them, cancelling that if the client goes away meanwhile (its
// primary gave up on the call and will send the batch again: a late copy
// must not be applied), and answers. false: the connection is done.
func (s *Server) replicate(c net.Conn, rd *bufio.Reader, req request, hdr []byte) bool {
	rb, ok := s.b.(Replicator)
	if !ok {
		s.reject(c, hdr, "unimplemented", codes.Unimplemented, errors.New("this server applies no replication batches"))
		return false
	}
	n := int(req.payloadLen)
	if n > s.cfg.MaxPayload {
		s.reject(c, hdr, "too_large", codes.InvalidArgument,
			fmt.Errorf("%w: payload of %d bytes exceeds the limit of %d (--max-message-mb)", errTooLarge, n, s.cfg.MaxPayload))
		return false
	}
	c.SetReadDeadline(time.Now().Add(s.lim.frameTime(n)))
	batch, held, err := readOps(rd, req, func(n int) ([]byte, error) { return s.bufs.get(s.ctx, n, s.lim.BufferWait) })
	c.SetReadDeadline(time.Time{})
	defer func() {
		for _, b := range held {
			s.bufs.put(b)
		}
	}()
	if err != nil {
		s.payloadFailed(c, hdr, n, err)
		return false
	}
	var ack *pb.ReplicaAck
	if s.watched(c, rd, func(ctx context.Context) { ack, err = rb.Replicate(ctx, batch) }) {
		return false
	}
	var resp response
	var body []byte
	if err != nil {
		st := status.Convert(err)
		resp.code, body = byte(st.Code()), []byte(st.Message())
	} else {
		resp.version, resp.dataPosition = ack.Version, ack.Seq
	}
	return s.respond(c, hdr, resp, body)
}
