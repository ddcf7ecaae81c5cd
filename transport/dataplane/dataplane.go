// Package dataplane carries pulls and pushes between workers and parameter
// servers over plain TCP (optionally TLS) with length-prefixed frames of
// raw float32 bytes: `--data-plane tcp`. gRPC stays the API and the control
// plane (Init, Status, Checkpoint, ...); this is the fast path for the two
// calls that move the model, the way TensorFlow added RDMA/MPI tensor
// transports beside gRPC.
//
// Why: a gRPC push+pull of 2 x 2.5 MB on loopback costs about 5 ms and
// most of a core on each side (HTTP/2 framing in 16 KB frames, protobuf
// copies of the payload); raw frames written with writev and read into a
// reused buffer cost a fraction of that (docs/scaling.md has the figures).
//
// The wire format (docs/wire.md), all integers little-endian:
//
//	request:  "PSD3" | op u8 (1 pull, 2 push, 3 replicate) | flags u8 |
//	          run-id length u8 | run id | worker i32 | version i64 |
//	          generation i64 | loss f32 | data position i64 |
//	          payload length u32 | role u8 | index i32 | session u64 |
//	          mac [16] | payload (push: the gradient; replicate: the
//	          batch's operations, replicate.go)
//	response: "PSD3" | code u8 (a gRPC status code; 0 = OK) | outcome u8 |
//	          flags u8 (bit 0 done, bit 1 shm) | version i64 |
//	          generation i64 | data position i64 | payload length u32 |
//	          payload (pull: the parameters; an error: its message)
//
// Request flags: bit 0 is a pull's retain (PullRequest.retain); bit 1
// (shm), a push's or a pull's, says the payload is in the connection's
// shared-memory region (shm.go): a push's gradient is there and not on
// the socket, and a pull's parameters may be answered there (the
// response's bit 1). A replicate frame has none, and any other bit is a
// malformed frame. A push carries the
// worker's data position once its gradient counts
// (PushRequest.data_position; 0 in a pull), a pull's response the
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
// Op 3 carries a primary's replication batch to its hot standby; its
// layout is in replicate.go. It needs no new magic: the pull and push
// frames did not change.
//
// One request is outstanding per connection. Errors carry gRPC status
// codes, so callers (the worker's retry loop) treat both planes alike: a
// connection that cannot be made or breaks is Unavailable.
package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
)

var magic = [4]byte{'P', 'S', 'D', '3'}

// Request ops.
const (
	opPull      = 1
	opPush      = 2
	opReplicate = 3 // a primary's replication batch to its standby (replicate.go)
)

// Request flags.
const (
	flagRetain = 1 << 0 // pull: PullRequest.retain
	flagShm    = 1 << 1 // push, pull: the payload is in the connection's shared region (shm.go)
)

// Response flags, in the byte that says done.
const (
	respDone = 1 << 0
	respShm  = 1 << 1 // the payload is in the connection's shared region, not on the socket
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
	shm        bool // push: the gradient is in the shared region; pull: answer there if it fits
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
	r.op = h[4]
	if r.op != opPull && r.op != opPush && r.op != opReplicate {
		return r, fmt.Errorf("%w: unknown op %d", ErrBadFrame, r.op)
	}
	switch flags := h[5]; {
	case flags&^(flagRetain|flagShm) != 0:
		return r, fmt.Errorf("%w: unknown flags %#x", ErrBadFrame, flags)
	case flags&flagRetain != 0 && r.op != opPull:
		return r, fmt.Errorf("%w: op %d with the retain flag", ErrBadFrame, r.op)
	case flags&flagShm != 0 && r.op == opReplicate:
		return r, fmt.Errorf("%w: op %d with the shared-memory flag", ErrBadFrame, r.op)
	default:
		r.retain = flags&flagRetain != 0
		r.shm = flags&flagShm != 0
	}
	n := int(h[6])
	rest := scratch[reqFixed : reqFixed+n+reqFields+reqAuth]
	if _, err := io.ReadFull(rd, rest); err != nil {
		return r, err
	}
	r.runID = string(rest[:n])
	f := rest[n:]
	r.worker = int32(binary.LittleEndian.Uint32(f[0:]))
	r.version = int64(binary.LittleEndian.Uint64(f[4:]))
	r.generation = int64(binary.LittleEndian.Uint64(f[12:]))
	r.loss = math.Float32frombits(binary.LittleEndian.Uint32(f[20:]))
	r.dataPos = int64(binary.LittleEndian.Uint64(f[24:]))
	r.payloadLen = binary.LittleEndian.Uint32(f[32:])
	a := f[reqFields:]
	if a[0] != unsigned {
		role := auth.RoleOf(a[0])
		if role == "" {
			return r, fmt.Errorf("%w: unknown role %d", ErrBadFrame, a[0])
		}
		r.id = auth.Identity{Role: role, Index: int(int32(binary.LittleEndian.Uint32(a[1:]))), Session: binary.LittleEndian.Uint64(a[5:])}
		r.mac = a[13:reqAuth]
		r.signed = scratch[:reqFixed+n+reqFields+13]
	}
	if int64(r.payloadLen) > int64(maxPayload) {
		return r, fmt.Errorf("%w: payload of %d bytes exceeds the limit of %d", ErrBadFrame, r.payloadLen, maxPayload)
	}
	if r.op == opPull && r.payloadLen != 0 {
		return r, fmt.Errorf("%w: a pull with a payload", ErrBadFrame)
	}
	return r, nil
}

// response is a decoded response header.
type response struct {
	code         byte
	outcome      byte
	done         bool
	shm          bool // the payload is in the shared region
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
	r.code, r.outcome, r.done, r.shm = h[4], h[5], h[6]&respDone != 0, h[6]&respShm != 0
	if h[6]&^(respDone|respShm) != 0 || r.outcome > byte(pb.PushResponse_DUPLICATE) {
		return r, fmt.Errorf("%w: bad flags", ErrBadFrame)
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

// grow returns buf with length n, reallocating only when it is too small.
func grow(buf []byte, n int) []byte {
	if cap(buf) < n {
		return make([]byte, n)
	}
	return buf[:n]
}
