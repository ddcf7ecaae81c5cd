package dataplane

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/pstrain/pstrain/proto"
)

// FuzzReadRequest: no input makes the frame reader panic or accept a
// payload beyond the limit.
func FuzzReadRequest(f *testing.F) {
	f.Add(appendSigned(nil, request{op: opPush, runID: "run-1", worker: 1, version: 2, generation: 3, loss: 0.5, dataPos: 7, payloadLen: 16}, nil))
	f.Add(appendSigned(nil, request{op: opPull, runID: ""}, nil))
	f.Add(appendSigned(nil, request{op: opPull, retain: true, runID: "run-1", worker: -1, version: 9}, nil))
	f.Add(appendSigned(nil, request{op: opReplicate, runID: "run-1", worker: 2, version: 3, generation: 4, dataPos: 1, payloadLen: 40}, nil))
	f.Add([]byte("PSD3\x01\x00\xff"))
	f.Add([]byte("PSD3\x02\x01\x00"))
	f.Add(appendSigned(nil, request{op: opPush, shm: true, runID: "run-1", worker: 1, payloadLen: 16}, nil))
	f.Add(appendSigned(nil, request{op: opPull, shm: true, retain: true, runID: "run-1"}, nil))
	f.Add([]byte("PSD3\x03\x02\x00"))
	f.Add(appendSigned(nil, request{op: opReplicate, shm: true, runID: "run-1", worker: 2, dataPos: 1, payloadLen: 40}, nil))
	f.Add(appendSigned(nil, request{op: opPull, delta: true, dataPos: 1 << 40, runID: "run-1", worker: 1}, nil))
	f.Add(appendSigned(nil, request{op: opPullRows, runID: "run-1", worker: 1, version: 4, generation: 2, payloadLen: 30}, nil))
	f.Add(appendSigned(nil, request{op: opPushRows, shm: true, runID: "run-1", worker: 0, version: 4, payloadLen: 60}, nil))
	f.Add([]byte("PSD3\x04\x01\x00"))
	f.Add(appendSigned(nil, request{op: opPush, afterRows: true, shm: true, runID: "run-1", worker: 1, version: 4, payloadLen: 16}, nil))
	f.Add([]byte("PSD3\x05\x08\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := readRequest(bytes.NewReader(b), make([]byte, 512), 64)
		if err != nil {
			return
		}
		if r.payloadLen > 64 || r.op < opPull || r.op > opPushRows || ((r.retain || r.delta) && r.op != opPull) || (r.afterRows && r.op != opPush) {
			t.Fatalf("accepted %+v", r)
		}
		// What was accepted encodes back to the bytes read.
		if again := appendRequest(nil, r); !bytes.Equal(again, b[:len(again)]) {
			t.Fatalf("%+v encodes as %q, read from %q", r, again, b)
		}
	})
}

// FuzzReadResponse: no input makes the response reader panic or accept
// a payload beyond the limit, and what it accepts encodes back the same.
func FuzzReadResponse(f *testing.F) {
	f.Add(appendResponse(nil, response{version: 5, generation: 2, dataPosition: 40, payloadLen: 16}))
	f.Add(appendResponse(nil, response{code: byte(codes.InvalidArgument), payloadLen: 9}))
	f.Add(appendResponse(nil, response{outcome: byte(pb.PushResponse_DUPLICATE), done: true, version: -1}))
	f.Add([]byte("PSD3\x00\x03\x02"))
	f.Add(appendResponse(nil, response{version: 5, done: true, shm: true, payloadLen: 16}))
	f.Add([]byte("PSD3\x00\x00\x04"))
	f.Add(appendResponse(nil, response{version: 5, shm: true, snap: true, outcome: snapSlots - 1, payloadLen: 16}))
	f.Add([]byte("PSD3\x00\x00\x08"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := readResponse(bytes.NewReader(b), make([]byte, respLen), 64)
		if err != nil {
			return
		}
		if r.payloadLen > 64 || r.snap && (!r.shm || r.outcome >= snapSlots) || !r.snap && r.outcome > byte(pb.PushResponse_DUPLICATE) {
			t.Fatalf("accepted %+v", r)
		}
		if again := appendResponse(nil, r); !bytes.Equal(again, b[:respLen]) {
			t.Fatalf("%+v encodes as %q, read from %q", r, again, b[:respLen])
		}
	})
}
