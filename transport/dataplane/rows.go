package dataplane

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"

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
	rowBufs // the answer written out, the request decoded
	in      []byte
	rows    []float32
	// pushFailed is the first row push refused since the connection's
	// last dense push (nil: none): a push sent after rows
	// (flagAfterRows) is then refused too.
	pushFailed error
}

// rowBufs is what one side of a row exchange writes out and what it
// decodes: a connection's answers and requests, a client's requests
// and answers.
type rowBufs struct {
	out []byte
	dec rowBlocks
}

// trim drops buffers grown past keepRowBytes.
func (b *rowBufs) trim() {
	if cap(b.out) > keepRowBytes {
		b.out = nil
	}
	if b.dec.held() > keepRowBytes {
		b.dec = rowBlocks{}
	}
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
	if 4*cap(r.rows) > keepRowBytes {
		r.rows = nil
	}
	r.rowBufs.trim()
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
		if err != nil && rc.pushFailed == nil {
			rc.pushFailed = err
		}
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

// PullRows is ParameterServerClient.PullRows over the data plane. The
// answer's rows are in memory of their own.
func (c *Client) PullRows(ctx context.Context, in *pb.PullRowsRequest, _ ...grpc.CallOption) (*pb.PullRowsResponse, error) {
	var out *pb.PullRowsResponse
	err := c.PullRowsPlaced(ctx, in, func(resp *pb.PullRowsResponse) error {
		out = &pb.PullRowsResponse{Version: resp.Version, Generation: resp.Generation, Done: resp.Done,
			Tables: make([]*pb.RowBlock, len(resp.Tables))}
		for i, t := range resp.Tables {
			out.Tables[i] = &pb.RowBlock{Table: t.Table, Keys: slices.Clone(t.Keys), Values: slices.Clone(t.Values),
				SmallKeys: slices.Clone(t.SmallKeys)}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PullRowsPlaced is PullRows handing the answer to place while its rows
// are still in the client's buffers, which the client's next call
// reuses: place must copy what it keeps (rowclient places the rows
// where its caller wants them). An error of place is the call's.
func (c *Client) PullRowsPlaced(ctx context.Context, in *pb.PullRowsRequest, place func(*pb.PullRowsResponse) error) error {
	return c.rowCall(ctx, request{op: opPullRows, runID: in.RunId, worker: in.Worker, version: in.MinVersion,
		generation: in.Generation}, in.Tables, func(resp response, body []byte) error {
		tables, err := c.rowBufs.dec.decode(body, fieldResponseTables)
		if err != nil {
			return status.Errorf(codes.Internal, "data plane: a row pull's answer: %v", err)
		}
		return place(&pb.PullRowsResponse{Tables: tables, Version: resp.version, Generation: resp.generation, Done: resp.done})
	})
}

// PushRows is ParameterServerClient.PushRows over the data plane.
func (c *Client) PushRows(ctx context.Context, in *pb.PushRowsRequest, _ ...grpc.CallOption) (*pb.PushRowsResponse, error) {
	var out *pb.PushRowsResponse
	err := c.rowCall(ctx, request{op: opPushRows, runID: in.RunId, worker: in.Worker, version: in.Version,
		generation: in.Generation}, in.Tables, func(resp response, _ []byte) error {
		out = &pb.PushRowsResponse{Outcome: pb.PushResponse_Outcome(resp.outcome), Version: resp.version, Done: resp.done}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PushAfterRows pushes rows, a shard's row gradients of a step, and
// then the step's dense gradient in (segs: its segments, as
// PushSegments takes them; nil: in.Grad), on one connection without
// waiting for an answer in between. The server answers a connection's
// requests in order, so the shard takes the rows before the dense
// gradient, as a sync shard requires of a worker's step, in one round
// trip instead of one per request; and it refuses the dense push,
// unapplied, when one of the rows was refused (the call's error is
// then the row push's). The rows travel on the socket (a shared region
// holds the dense gradient).
//
// answers has one entry per row push: its answer if it was taken, nil
// if it was refused or its answer never came, also when err is not nil
// (a caller sending the step again sends only the rows without one).
// err is the first row push's error, else the dense push's.
func (c *Client) PushAfterRows(ctx context.Context, rows []*pb.PushRowsRequest, in *pb.PushRequest, segs [][]float32) (answers []*pb.PushRowsResponse, _ *pb.PushResponse, err error) {
	payload := net.Buffers{in.Grad}
	if segs != nil {
		payload = segmentBuffers(segs)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.rowBufs.trim()
	pre := make([]ahead, len(rows))
	ends := make([]int, len(rows))
	out := c.rowBufs.out[:0]
	for i, r := range rows {
		out = appendBlocks(out, fieldRequestTables, r.Tables)
		ends[i] = len(out)
		pre[i].req = request{op: opPushRows, runID: r.RunId, worker: r.Worker, version: r.Version, generation: r.Generation}
	}
	c.rowBufs.out = out
	start := 0
	for i := range pre {
		pre[i].payload = out[start:ends[i]:ends[i]]
		pre[i].req.payloadLen = uint32(ends[i] - start)
		start = ends[i]
	}
	resp, _, err := c.callAfter(ctx, pre, request{op: opPush, afterRows: len(rows) > 0, runID: in.RunId, worker: in.Worker, version: in.Version,
		generation: in.Generation, loss: in.Loss, dataPos: in.DataPosition}, payload, nil, false)
	answers = make([]*pb.PushRowsResponse, len(pre))
	for i, p := range pre {
		if p.read && p.resp.code == 0 {
			answers[i] = &pb.PushRowsResponse{Outcome: pb.PushResponse_Outcome(p.resp.outcome), Version: p.resp.version, Done: p.resp.done}
		}
	}
	if err != nil {
		return answers, nil, err
	}
	return answers, &pb.PushResponse{Outcome: pb.PushResponse_Outcome(resp.outcome), Version: resp.version, Done: resp.done}, nil
}

// rowCall makes a row request of tables under the client's lock, its
// payload written into the client's buffer, and runs use on the answer
// before the lock is released.
func (c *Client) rowCall(ctx context.Context, req request, tables []*pb.RowBlock, use func(response, []byte) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.rowBufs.trim()
	c.rowBufs.out = appendBlocks(c.rowBufs.out[:0], fieldRequestTables, tables)
	resp, body, err := c.callLocked(ctx, req, net.Buffers{c.rowBufs.out}, nil, false)
	if err != nil {
		return err
	}
	return use(resp, body)
}
