package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
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

// replicate reads a replicate frame's operations (its pushes' gradients
// into buffers of the budget, from the socket within the frame's time,
// or from the connection's shared region shm when the frame says the
// payload is there), has the backend apply them, cancelling that if the
// client goes away meanwhile (its primary gave up on the call and will
// send the batch again: a late copy must not be applied), and answers.
// false: the connection is done.
//
// (A gradient is copied out of the region, not applied where it is: the
// operations' headers leave it at an offset float32s cannot be read at
// in place, and the shard would copy it anyway.)
func (s *Server) replicate(c net.Conn, rd *bufio.Reader, req request, hdr, shm []byte) bool {
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
	var src io.Reader = rd
	if req.shm {
		s.inShm.Add(1)
		src = bytes.NewReader(shm[:n])
	} else {
		c.SetReadDeadline(time.Now().Add(s.lim.frameTime(n)))
	}
	batch, held, err := readOps(src, req, func(n int) ([]byte, error) { return s.bufs.get(s.ctx, n, s.lim.BufferWait) })
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
		resp, body = errorAnswer(err)
	} else {
		resp.version, resp.dataPosition = ack.Version, ack.Seq
	}
	return s.respond(c, hdr, resp, body)
}
