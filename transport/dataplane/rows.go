package dataplane

import (
	"bufio"
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pstrain/pstrain/proto"
)

// Embedding rows on the data plane (ops 4 and 5, frame.go): a CTR
// worker's row pulls and pushes, which over gRPC cost the shard and the
// worker as much CPU in HTTP/2 framing as in the rows' own work. The
// header carries what the request's other fields say; the payload, only
// the tables, protobuf-encoded (the RowBlock layout, docs/wire.md).

// RowServer is a Backend that serves embedding rows (*ps.Server does);
// a server whose backend is not one answers row requests Unimplemented.
type RowServer interface {
	PullRows(context.Context, *pb.PullRowsRequest) (*pb.PullRowsResponse, error)
	PushRows(context.Context, *pb.PushRowsRequest) (*pb.PushRowsResponse, error)
}

// RowNowPuller is a RowServer that can also answer a row pull that
// need not wait without a context (*ps.Server does): ready is false,
// and nothing done, when the pull would wait. The answer's rows are in
// the memory rows returns for the n values they need (nil: new memory).
type RowNowPuller interface {
	PullRowsNow(req *pb.PullRowsRequest, rows func(n int) []float32) (resp *pb.PullRowsResponse, ready bool, err error)
}

// rowConn is a connection's buffers for row requests: the request's
// payload read in and decoded, the rows of a pull's answer, and the
// answer written out. They are the connection's own, not the push
// budget's (sized for the dense gradient), and kept while they stay
// within keepRowBytes.
type rowConn struct {
	in, out []byte
	dec     rowBlocks
	rows    []float32
}

// answerRows is the connection's memory for a pull answer's n values,
// which hold the connection's last answer: the shard writes every one
// (PullSlots and Peek write each row they are asked for).
func (r *rowConn) answerRows(n int) []float32 {
	if cap(r.rows) < n {
		r.rows = make([]float32, n)
	}
	return r.rows[:n]
}

// keepRowBytes bounds the row buffers a connection keeps between
// requests: a rowclient request's rows are at most 512 KiB.
const keepRowBytes = 1 << 20

// maxRowPayload bounds a row request's payload (and the server's
// message limit too): 16 times a rowclient request's rows at most, so a
// client cannot make a connection hold the whole message limit.
const maxRowPayload = 16 << 20

// trim drops buffers grown past keepRowBytes.
func (r *rowConn) trim() {
	if cap(r.in) > keepRowBytes {
		r.in = nil
	}
	if cap(r.out) > keepRowBytes {
		r.out = nil
	}
	if 4*cap(r.rows) > keepRowBytes {
		r.rows = nil
	}
	if r.dec.held() > keepRowBytes {
		r.dec = rowBlocks{}
	}
}

// serveRows reads a row request's payload and answers it. false: the
// connection is done.
func (s *Server) serveRows(c net.Conn, rd *bufio.Reader, req request, hdr, shm []byte, rc *rowConn) bool {
	defer rc.trim()
	n := int(req.payloadLen)
	if limit := min(s.cfg.MaxPayload, maxRowPayload); n > limit {
		s.reject(c, hdr, "too_large", codes.InvalidArgument,
			fmt.Errorf("dataplane: a row request of %d bytes exceeds the limit of %d", n, limit))
		return false
	}
	rc.in = grow(rc.in, n)
	if req.shm {
		copy(rc.in, shm[:n])
	} else if !s.readSocket(c, rd, hdr, rc.in) {
		return false
	}
	var resp response
	var body []byte
	var err error
	switch req.op {
	case opPullRows:
		var gone bool
		body, gone, err = s.pullRows(c, rd, req, rc, &resp)
		if gone {
			return false
		}
	case opPushRows:
		err = s.pushRows(req, rc, &resp)
	}
	if err != nil {
		resp, body = errorAnswer(err)
	}
	return s.respond(c, hdr, resp, body)
}

// rowServer is the backend as a RowServer, or Unimplemented.
func (s *Server) rowServer() (RowServer, error) {
	rs, ok := s.b.(RowServer)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "this server holds no embedding rows")
	}
	return rs, nil
}

// pullRows answers a row pull (which may wait for its version), its rows
// marshalled into rc.out. gone: the client left while it waited.
func (s *Server) pullRows(c net.Conn, rd *bufio.Reader, req request, rc *rowConn, resp *response) (body []byte, gone bool, err error) {
	rs, err := s.rowServer()
	if err != nil {
		return nil, false, err
	}
	tables, err := rc.dec.decode(rc.in, fieldRequestTables)
	if err != nil {
		return nil, false, status.Errorf(codes.InvalidArgument, "a row pull's tables: %v", err)
	}
	in := &pb.PullRowsRequest{RunId: req.runID, Worker: req.worker, MinVersion: req.version, Generation: req.generation, Tables: tables}
	var out *pb.PullRowsResponse
	ready := false
	if now, ok := rs.(RowNowPuller); ok {
		// A pull that need not wait needs no watcher (as a dense pull's:
		// server.go, pull); a sync worker's is of the version its dense
		// pull just read.
		out, ready, err = now.PullRowsNow(in, rc.answerRows)
	}
	if !ready && s.watched(c, rd, func(ctx context.Context) { out, err = rs.PullRows(ctx, in) }) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	resp.version, resp.generation, resp.done = out.Version, out.Generation, out.Done
	rc.out = appendBlocks(rc.out[:0], fieldResponseTables, out.Tables)
	return rc.out, false, nil
}

// pushRows applies or stages a row push.
func (s *Server) pushRows(req request, rc *rowConn, resp *response) error {
	rs, err := s.rowServer()
	if err != nil {
		return err
	}
	tables, err := rc.dec.decode(rc.in, fieldRequestTables)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "a row push's tables: %v", err)
	}
	in := &pb.PushRowsRequest{RunId: req.runID, Worker: req.worker, Version: req.version, Generation: req.generation, Tables: tables}
	out, err := rs.PushRows(context.Background(), in)
	if err != nil {
		return err
	}
	resp.outcome, resp.version, resp.done = byte(out.Outcome), out.Version, out.Done
	return nil
}

// PullRows is ParameterServerClient.PullRows over the data plane.
func (c *Client) PullRows(ctx context.Context, in *pb.PullRowsRequest, _ ...grpc.CallOption) (*pb.PullRowsResponse, error) {
	payload := rowPayload(in.Tables)
	out := &pb.PullRowsResponse{}
	err := c.callThen(ctx, request{op: opPullRows, runID: in.RunId, worker: in.Worker, version: in.MinVersion,
		generation: in.Generation}, net.Buffers{payload}, func(resp response, body []byte) error {
		// (A fresh decoder: the answer's rows are copied out of body
		// into memory of their own.)
		var d rowBlocks
		tables, err := d.decode(body, fieldResponseTables)
		if err != nil {
			return status.Errorf(codes.Internal, "data plane: a row pull's answer: %v", err)
		}
		out.Tables, out.Version, out.Generation, out.Done = tables, resp.version, resp.generation, resp.done
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PushRows is ParameterServerClient.PushRows over the data plane.
func (c *Client) PushRows(ctx context.Context, in *pb.PushRowsRequest, _ ...grpc.CallOption) (*pb.PushRowsResponse, error) {
	resp, _, err := c.call(ctx, request{op: opPushRows, runID: in.RunId, worker: in.Worker, version: in.Version,
		generation: in.Generation}, net.Buffers{rowPayload(in.Tables)}, nil, false)
	if err != nil {
		return nil, err
	}
	return &pb.PushRowsResponse{Outcome: pb.PushResponse_Outcome(resp.outcome), Version: resp.version, Done: resp.done}, nil
}

// rowPayload is a row request's payload: its tables, encoded.
func rowPayload(tables []*pb.RowBlock) []byte {
	return appendBlocks(make([]byte, 0, blocksSize(fieldRequestTables, tables)), fieldRequestTables, tables)
}
