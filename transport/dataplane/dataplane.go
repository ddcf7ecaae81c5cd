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
// The frame (its layout table, encoding and decoding, and those of a
// replication batch's payload) is defined in frame.go; docs/wire.md
// describes how the plane uses it.
//
// One request is outstanding per connection. Errors carry gRPC status
// codes, so callers (the worker's retry loop) treat both planes alike: a
// connection that cannot be made or breaks is Unavailable.
package dataplane

// grow returns buf with length n, reallocating only when it is too small.
func grow(buf []byte, n int) []byte {
	if cap(buf) < n {
		return make([]byte, n)
	}
	return buf[:n]
}
