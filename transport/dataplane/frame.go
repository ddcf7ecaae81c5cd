package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"

	"google.golang.org/protobuf/proto"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
)

// This file defines the data plane's frame: its layout, and the code
// that encodes and decodes it (the fuzz tests are in frame_test.go).
//
// The wire format (docs/wire.md), all integers little-endian:
//
//	request:  "PSD3" | op u8 (1 pull, 2 push, 3 replicate, 4 pull rows,
//	          5 push rows) | flags u8 |
//	          run-id length u8 | run id | worker i32 | version i64 |
//	          generation i64 | loss f32 | data position i64 |
//	          payload length u32 | role u8 | index i32 | session u64 |
//	          mac [16] | payload (push: the gradient; replicate: the
//	          batch's operations, below)
//	response: "PSD3" | code u8 (a gRPC status code; 0 = OK) | outcome u8 |
//	          flags u8 (bit 0 done, bit 1 shm, bit 2 snap) | version i64 |
//	          generation i64 | data position i64 | payload length u32 |
//	          payload (pull: the parameters; an error: its message)
//
// Request flags: bit 0 is a pull's retain (PullRequest.retain); bit 2 a
// pull's delta (PullRequest.delta: the answer may be a compressed delta;
// the data position field then carries PullRequest.delta_base); bit 1
// (shm) says the payload is in the connection's shared-memory region
// (shm.go): a push's gradient or a replicate frame's operations are
// there and not on the socket, and a pull's parameters may be answered
// there (the response's bit 1); bit 3 (afterRows) says a push follows
// row pushes of its step on the connection (PushAfterRows), and is
// refused unapplied if one of them was. Any other bit is a malformed
// frame. A push carries the worker's data position once its gradient
// counts (PushRequest.data_position; 0 in a pull), a pull's response the
// pulling worker's data position (PullResponse.data_position; 0 for a
// push). Role, index and session name the sender's session
// (transport/auth; role 255 and zeros: unsigned) and mac is the
// session's HMAC of every header byte before it, so a server with a
// keyring refuses a frame it did not sign before reading its payload.
// "PSD1" and "PSD2", the formats before the data positions and before
// the credential, are refused as a bad magic: a worker and a PS of
// different builds fail clearly instead of misreading each other's
// frames.
//
// Ops 4 and 5 carry embedding rows (PullRows, PushRows): the header
// says the run, the worker, the version (a pull's minimum version, a
// push's version the rows were read at) and the generation, and the
// payload is the request's tables, a PullRowsRequest or PushRowsRequest
// of which only the tables field is read. A pull's answer carries the
// version, generation and done in its header and the rows in its
// payload, a PullRowsResponse of which only the tables are read; a
// push's answer, its outcome, version and done, and no payload. Their
// only flag is shm (the request's payload in the shared region); their
// answers travel on the socket.
//
// Op 3 carries a primary's replication batch to its hot standby; its
// payload's layout is below ("Replication batches"). It needs no new magic: the pull and push
// frames did not change.

// magic opens every request and response.
var magic = [4]byte{'P', 'S', 'D', '3'}

// Request ops.
const (
	opPull      = 1
	opPush      = 2
	opReplicate = 3 // a primary's replication batch to its standby (below)
	opPullRows  = 4 // embedding rows (rows.go)
	opPushRows  = 5 // embedding rows' gradients (rows.go)
)

// Request flags.
const (
	flagRetain = 1 << 0 // pull: PullRequest.retain
	flagShm    = 1 << 1 // push, pull: the payload is in the connection's shared region (shm.go)
	flagDelta  = 1 << 2 // pull: PullRequest.delta, with delta_base in the data position
	// push: the step's row pushes went just ahead of it on the
	// connection (PushAfterRows); if one of them failed, the push is
	// refused, not applied.
	flagAfterRows = 1 << 3
)

// Response flags, in the byte that says done.
const (
	respDone = 1 << 0
	respShm  = 1 << 1 // the payload is in the connection's shared region, not on the socket
	respSnap = 1 << 2 // with respShm: the payload is in the server's snapshot slot named by the outcome byte
)

const (
	reqFixed  = 4 + 1 + 1 + 1                 // magic, op, flags, run-id length
	reqFields = 4 + 8 + 8 + 4 + 8 + 4         // worker, version, generation, loss, data position, payload length
	reqAuth   = 1 + 4 + 8 + auth.MACLen       // role, index, session, mac
	respLen   = 4 + 1 + 1 + 1 + 8 + 8 + 8 + 4 // magic ... payload length
)

// ErrBadFrame is wrapped by errors about malformed frames.
var ErrBadFrame = errors.New("dataplane: malformed frame")

// request is a decoded request header.
type request struct {
	op         byte
	retain     bool // pull: keep this version for a retained checkpoint
	afterRows  bool // push: flagAfterRows
	shm        bool // push: the gradient is in the shared region; pull: answer there if it fits
	delta      bool // pull: PullRequest.delta (dataPos is delta_base)
	runID      string
	worker     int32
	version    int64 // pull: the minimum version
	generation int64
	loss       float32
	dataPos    int64 // push: PushRequest.data_position
	payloadLen uint32

	// The credential: who sent it (Role "" when unsigned), the MAC and
	// the bytes it covers (slices of the reader's scratch buffer).
	id     auth.Identity
	mac    []byte
	signed []byte
}

// unsigned is the role byte of a frame without a credential.
const unsigned = 255

// appendSigned appends r's header and its credential: signed by c, or
// unsigned when c is nil.
func appendSigned(b []byte, r request, c *auth.Client) []byte {
	start := len(b)
	b = appendRequest(b, r)
	if c == nil {
		b = append(b, unsigned)
		return append(b, make([]byte, 4+8+auth.MACLen)...)
	}
	id := c.Identity()
	b = append(b, byte(auth.RoleCode(id.Role)))
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(id.Index)))
	b = binary.LittleEndian.AppendUint64(b, id.Session)
	return append(b, c.Keys.FrameMAC(id, b[start:])...)
}

func appendRequest(b []byte, r request) []byte {
	b = append(b, magic[:]...)
	flags := byte(0)
	if r.retain {
		flags |= flagRetain
	}
	if r.shm {
		flags |= flagShm
	}
	if r.delta {
		flags |= flagDelta
	}
	if r.afterRows {
		flags |= flagAfterRows
	}
	b = append(b, r.op, flags, byte(len(r.runID)))
	b = append(b, r.runID...)
	b = binary.LittleEndian.AppendUint32(b, uint32(r.worker))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.version))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.generation))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(r.loss))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.dataPos))
	return binary.LittleEndian.AppendUint32(b, r.payloadLen)
}

// readRequest reads a request header; maxPayload bounds the payload.
func readRequest(rd io.Reader, scratch []byte, maxPayload int) (request, error) {
	var r request
	h := scratch[:reqFixed]
	if _, err := io.ReadFull(rd, h); err != nil {
		return r, err
	}
	if [4]byte(h[:4]) != magic {
		return r, fmt.Errorf("%w: bad magic %q", ErrBadFrame, h[:4])
	}
	if err := r.decodeOp(h[4], h[5]); err != nil {
		return r, err
	}
	n := int(h[6])
	rest := scratch[reqFixed : reqFixed+n+reqFields+reqAuth]
	if _, err := io.ReadFull(rd, rest); err != nil {
		return r, err
	}
	r.runID = string(rest[:n])
	r.decodeFields(rest[n:])
	if err := r.decodeCredential(rest[n+reqFields:], scratch[:reqFixed+n+reqFields+13]); err != nil {
		return r, err
	}
	if int64(r.payloadLen) > int64(maxPayload) {
		return r, fmt.Errorf("%w: payload of %d bytes exceeds the limit of %d", ErrBadFrame, r.payloadLen, maxPayload)
	}
	if r.op == opPull && r.payloadLen != 0 {
		return r, fmt.Errorf("%w: a pull with a payload", ErrBadFrame)
	}
	return r, nil
}

// decodeOp sets r's op and flags from their bytes: a known op, and only
// the flags that op may carry.
func (r *request) decodeOp(op, flags byte) error {
	r.op = op
	switch {
	case op < opPull || op > opPushRows:
		return fmt.Errorf("%w: unknown op %d", ErrBadFrame, op)
	case flags&^(flagRetain|flagShm|flagDelta|flagAfterRows) != 0:
		return fmt.Errorf("%w: unknown flags %#x", ErrBadFrame, flags)
	case flags&(flagRetain|flagDelta) != 0 && op != opPull:
		return fmt.Errorf("%w: op %d with a pull's flag %#x", ErrBadFrame, op, flags)
	case flags&flagAfterRows != 0 && op != opPush:
		return fmt.Errorf("%w: op %d with a push's flag %#x", ErrBadFrame, op, flags)
	}
	r.retain = flags&flagRetain != 0
	r.shm = flags&flagShm != 0
	r.delta = flags&flagDelta != 0
	r.afterRows = flags&flagAfterRows != 0
	return nil
}

// decodeFields sets r's fixed fields, worker to payload length, from
// their reqFields bytes f.
func (r *request) decodeFields(f []byte) {
	r.worker = int32(binary.LittleEndian.Uint32(f[0:]))
	r.version = int64(binary.LittleEndian.Uint64(f[4:]))
	r.generation = int64(binary.LittleEndian.Uint64(f[12:]))
	r.loss = math.Float32frombits(binary.LittleEndian.Uint32(f[20:]))
	r.dataPos = int64(binary.LittleEndian.Uint64(f[24:]))
	r.payloadLen = binary.LittleEndian.Uint32(f[32:])
}

// decodeCredential sets r's sender, MAC and signed bytes from the
// credential's reqAuth bytes a (a slice of the reader's scratch buffer);
// signed is the header up to the MAC. An unsigned frame leaves them
// empty.
func (r *request) decodeCredential(a, signed []byte) error {
	if a[0] == unsigned {
		return nil
	}
	role := auth.RoleOf(a[0])
	if role == "" {
		return fmt.Errorf("%w: unknown role %d", ErrBadFrame, a[0])
	}
	r.id = auth.Identity{Role: role, Index: int(int32(binary.LittleEndian.Uint32(a[1:]))), Session: binary.LittleEndian.Uint64(a[5:])}
	r.mac = a[13:reqAuth]
	r.signed = signed
	return nil
}

// response is a decoded response header.
type response struct {
	code         byte
	outcome      byte
	done         bool
	shm          bool // the payload is in the shared region
	snap         bool // with shm: in the server's snapshot slot outcome (snapshots.go)
	version      int64
	generation   int64
	dataPosition int64 // pull: the pulling worker's
	payloadLen   uint32
}

func appendResponse(b []byte, r response) []byte {
	b = append(b, magic[:]...)
	d := byte(0)
	if r.done {
		d |= respDone
	}
	if r.shm {
		d |= respShm
	}
	if r.snap {
		d |= respSnap
	}
	b = append(b, r.code, r.outcome, d)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.version))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.generation))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.dataPosition))
	return binary.LittleEndian.AppendUint32(b, r.payloadLen)
}

func readResponse(rd io.Reader, scratch []byte, maxPayload int) (response, error) {
	var r response
	h := scratch[:respLen]
	if _, err := io.ReadFull(rd, h); err != nil {
		return r, err
	}
	if [4]byte(h[:4]) != magic {
		return r, fmt.Errorf("%w: bad magic %q", ErrBadFrame, h[:4])
	}
	r.code, r.outcome, r.done, r.shm, r.snap = h[4], h[5], h[6]&respDone != 0, h[6]&respShm != 0, h[6]&respSnap != 0
	switch {
	case h[6]&^(respDone|respShm|respSnap) != 0, r.snap && !r.shm:
		return r, fmt.Errorf("%w: bad flags", ErrBadFrame)
	case !r.snap && r.outcome > byte(pb.PushResponse_DUPLICATE), r.snap && r.outcome >= snapSlots:
		return r, fmt.Errorf("%w: bad outcome %d", ErrBadFrame, r.outcome)
	}
	r.version = int64(binary.LittleEndian.Uint64(h[7:]))
	r.generation = int64(binary.LittleEndian.Uint64(h[15:]))
	r.dataPosition = int64(binary.LittleEndian.Uint64(h[23:]))
	r.payloadLen = binary.LittleEndian.Uint32(h[31:])
	if int64(r.payloadLen) > int64(maxPayload) {
		return r, fmt.Errorf("%w: payload of %d bytes exceeds the limit of %d", ErrBadFrame, r.payloadLen, maxPayload)
	}
	return r, nil
}

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
//	            other: kind u8 (1 snapshot, 3 membership, 4 stop,
//	                   6 row pull, 7 row push, 8 a snapshot's rows) |
//	                   length u32 | the protobuf encoding of that message
//	                   (ReplicaSnapshot, MembershipRequest, StopRequest,
//	                   PullRowsRequest, PushRowsRequest, TableRowsChunk)
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
	kindPullRows   = 6
	kindPushRows   = 7
	kindRows       = 8
)

const (
	pushOpLen  = 1 + 4 + 8 + 8 + 4 + 8 + 4 // kind ... gradient length
	otherOpLen = 1 + 4                     // kind, length
)

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
	case *pb.ReplicaOp_PullRows:
		kind, m = kindPullRows, x.PullRows
	case *pb.ReplicaOp_PushRows:
		kind, m = kindPushRows, x.PushRows
	case *pb.ReplicaOp_Rows:
		kind, m = kindRows, x.Rows
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

// readOtherOp reads an operation other than a push (a protobuf message,
// or a retain's version) after its kind byte, k.
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
	case kindPullRows:
		x := &pb.PullRowsRequest{}
		op.Op, m = &pb.ReplicaOp_PullRows{PullRows: x}, x
	case kindPushRows:
		x := &pb.PushRowsRequest{}
		op.Op, m = &pb.ReplicaOp_PushRows{PushRows: x}, x
	case kindRows:
		x := &pb.TableRowsChunk{}
		op.Op, m = &pb.ReplicaOp_Rows{Rows: x}, x
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
