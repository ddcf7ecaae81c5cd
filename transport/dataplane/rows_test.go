package dataplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/wire"
)

// rowBackend is fakeBackend with rows: a pull answers each block's keys
// as their values (key+0.5, as float32 bytes would be: here one byte a
// key), and records what each request said; a pull of min version 9
// waits until cancelled.
type rowBackend struct {
	fakeBackend
	pulls  []*pb.PullRowsRequest
	pushes []*pb.PushRowsRequest
	waited chan context.Context
}

func (b *rowBackend) PullRows(ctx context.Context, in *pb.PullRowsRequest) (*pb.PullRowsResponse, error) {
	b.mu.Lock()
	b.pulls = append(b.pulls, proto.Clone(in).(*pb.PullRowsRequest))
	b.mu.Unlock()
	if in.MinVersion == 9 {
		b.waited <- ctx
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	out := &pb.PullRowsResponse{Version: in.MinVersion + 1, Generation: in.Generation, Done: in.Worker == 1}
	for _, t := range in.Tables {
		v := make([]byte, 0, len(t.Keys))
		for _, k := range t.Keys {
			v = append(v, byte(k))
		}
		out.Tables = append(out.Tables, &pb.RowBlock{Table: t.Table, Values: v})
	}
	return out, nil
}

func (b *rowBackend) PushRows(_ context.Context, in *pb.PushRowsRequest) (*pb.PushRowsResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pushes = append(b.pushes, proto.Clone(in).(*pb.PushRowsRequest))
	if in.Version < 0 {
		return nil, status.Error(codes.InvalidArgument, "a push from a negative version")
	}
	return &pb.PushRowsResponse{Outcome: pb.PushResponse_STALE, Version: in.Version + 3, Done: true}, nil
}

// TestRowsRoundTrip: a row pull's and push's fields reach the backend
// (the header's, whatever the payload's say), their answers come back
// whole, and a backend's error is the caller's status.
func TestRowsRoundTrip(t *testing.T) {
	b := &rowBackend{waited: make(chan context.Context, 1)}
	keys := auth.NewKeyring(auth.Token("the run's token, thirty-two bytes or more"))
	addr, _ := startAuth(t, b, keys, 1<<20)
	ctx := context.Background()
	w0 := signed(addr, keys, auth.RoleWorker, 0, 1<<20)
	defer w0.Close()

	tables := []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{3, 1, 4}}, {Table: "emb/C2", SmallKeys: []uint64{1, 5}}}
	got, err := w0.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Worker: 0, Generation: 6, MinVersion: 2, Tables: tables})
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 3 || got.Generation != 6 || got.Done || len(got.Tables) != 2 || !slices.Equal(got.Tables[0].Values, []byte{3, 1, 4}) ||
		got.Tables[1].Table != "emb/C2" || len(got.Tables[1].Values) != 0 {
		t.Fatalf("pull answered %v", got)
	}
	pushed, err := w0.PushRows(ctx, &pb.PushRowsRequest{RunId: "r", Worker: 0, Generation: 6, Version: 5,
		Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{3}, Values: []byte{1, 2, 3, 4}}}})
	if err != nil || pushed.Outcome != pb.PushResponse_STALE || pushed.Version != 8 || !pushed.Done {
		t.Fatalf("push answered %v, %v", pushed, err)
	}
	if _, err := w0.PushRows(ctx, &pb.PushRowsRequest{RunId: "r", Worker: 0, Version: -1}); status.Code(err) != codes.InvalidArgument ||
		status.Convert(err).Message() != "a push from a negative version" {
		t.Fatalf("a push the backend refuses: %v", err)
	}
	b.mu.Lock()
	pull, push := b.pulls[0], b.pushes[0]
	b.mu.Unlock()
	if pull.RunId != "r" || pull.Worker != 0 || pull.Generation != 6 || pull.MinVersion != 2 || !proto.Equal(pull.Tables[1], tables[1]) {
		t.Fatalf("the backend got the pull %v", pull)
	}
	if push.Worker != 0 || push.Version != 5 || push.Generation != 6 || !slices.Equal(push.Tables[0].Values, []byte{1, 2, 3, 4}) {
		t.Fatalf("the backend got the push %v", push)
	}

	// The chief reads rows as -1; a worker may not read or train as
	// another, nor the chief train.
	chief := signed(addr, keys, auth.RoleChief, 0, 1<<20)
	defer chief.Close()
	if _, err := chief.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Worker: -1}); err != nil {
		t.Fatalf("the chief's row pull: %v", err)
	}
	w1 := signed(addr, keys, auth.RoleWorker, 1, 1<<20)
	defer w1.Close()
	if _, err := w1.PushRows(ctx, &pb.PushRowsRequest{RunId: "r", Worker: 0}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("worker/1 pushing rows as worker 0: %v", err)
	}
	w1 = signed(addr, keys, auth.RoleWorker, 1, 1<<20)
	defer w1.Close()
	if _, err := w1.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Worker: 0}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("worker/1 pulling rows as worker 0: %v", err)
	}
	chief = signed(addr, keys, auth.RoleChief, 0, 1<<20)
	defer chief.Close()
	if _, err := chief.PushRows(ctx, &pb.PushRowsRequest{RunId: "r", Worker: 0}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the chief pushing rows: %v", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pushes) != 2 || len(b.pulls) != 2 {
		t.Errorf("%d pushes and %d pulls reached the backend, want 2 and 2 (the allowed ones)", len(b.pushes), len(b.pulls))
	}
}

// TestRowPullCancelledWhenTheClientLeaves: a row pull waiting for its
// version at the shard is cancelled when its caller gives up.
func TestRowPullCancelledWhenTheClientLeaves(t *testing.T) {
	b := &rowBackend{waited: make(chan context.Context, 1)}
	addr, _ := startAuth(t, b, nil, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", MinVersion: 9})
		errc <- err
	}()
	held := <-b.waited
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		t.Fatalf("the cancelled pull: %v", err)
	}
	select {
	case <-held.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the shard's pull still waits 10 s after its client left")
	}
}

// TestRowsOverTheSocket: without shared memory (another host, or a PS
// refusing regions) a row request's payload and its answer travel on
// the socket; a header's fields win over what the payload says; and a
// request past the row limit is refused before its payload is read,
// the client connecting again for the next.
func TestRowsOverTheSocket(t *testing.T) {
	b := &rowBackend{waited: make(chan context.Context, 1)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(b, lis, Config{MaxPayload: 64 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), NoSharedMemory: true})
	serveTest(t, s)
	c := client(lis.Addr().String(), 64<<20)
	defer c.Close()
	ctx := context.Background()
	keys := make([]uint64, 70000) // (a payload over the socket's 64 KiB reader)
	for i := range keys {
		keys[i] = uint64(i)
	}
	got, err := c.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Generation: 2, MinVersion: 4, Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: keys}}})
	if err != nil || got.Version != 5 || len(got.Tables[0].Values) != len(keys) || got.Tables[0].Values[300] != byte(keys[300]) {
		t.Fatalf("a pull over the socket: %v", err)
	}
	// The payload's own fields say another run, worker and versions.
	payload, err := proto.Marshal(&pb.PushRowsRequest{RunId: "other", Worker: 5, Version: 7, Generation: 8,
		Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{1}, Values: []byte{9, 9, 9, 9}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.call(ctx, request{op: opPushRows, runID: "r", worker: 0, version: 3, generation: 2}, net.Buffers{payload}, nil, false); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	push := b.pushes[0]
	b.mu.Unlock()
	if push.RunId != "r" || push.Worker != 0 || push.Version != 3 || push.Generation != 2 {
		t.Fatalf("the backend got the push %v: the payload's fields, not the header's", push)
	}
	// Garbage for tables: refused, and the connection serves on.
	for _, op := range []byte{opPullRows, opPushRows} {
		_, _, err := c.call(ctx, request{op: op, runID: "r"}, net.Buffers{{0xff, 0xff, 0xff}}, nil, false)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("op %d with a payload that is no message: %v, want InvalidArgument", op, err)
		}
	}
	huge := make([]uint64, maxRowPayload/8+1)
	if _, err := c.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: huge}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a row request over %d bytes: %v, want InvalidArgument", maxRowPayload, err)
	}
	if _, err := c.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: keys[:3]}}}); err != nil {
		t.Fatalf("a pull after the refusal: %v", err)
	}
}

// TestRowPullsAtOnceOnOneClient: a Client's row pulls may be called
// from several goroutines, as a gRPC client's (rowclient.Shard); each
// gets its own answer (go test -race checks the client's buffer).
func TestRowPullsAtOnceOnOneClient(t *testing.T) {
	b := &rowBackend{waited: make(chan context.Context, 1)}
	addr, _ := startAuth(t, b, nil, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Go(func() {
			keys := []uint64{uint64(g), uint64(g + 10)}
			for range 50 {
				got, err := c.PullRows(context.Background(), &pb.PullRowsRequest{RunId: "r", Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: keys}}})
				if err != nil || !slices.Equal(got.Tables[0].Values, []byte{byte(g), byte(g + 10)}) {
					errs <- fmt.Errorf("goroutine %d: %v, %v", g, got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestRowsOfABackendWithoutRows: Unimplemented, and the connection goes
// on serving.
func TestRowsOfABackendWithoutRows(t *testing.T) {
	_, addr := start(t, 1<<20)
	c := client(addr, 1<<20)
	defer c.Close()
	ctx := context.Background()
	if _, err := c.PullRows(ctx, &pb.PullRowsRequest{RunId: "r"}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("a row pull of a server without rows: %v", err)
	}
	if _, err := c.PushRows(ctx, &pb.PushRowsRequest{RunId: "r"}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("a row push of a server without rows: %v", err)
	}
	if _, err := c.Push(ctx, &pb.PushRequest{RunId: "r", Grad: make([]byte, 8)}); err != nil {
		t.Fatalf("a push after them: %v", err)
	}
}

// lendingBackend is rowBackend answering pulls at once in the memory the
// data plane lends (RowNowPuller): one float32 a key, key+0.5, and the
// first value's address of each answer.
type lendingBackend struct {
	rowBackend
	lent []*float32
}

func (b *lendingBackend) PullRowsNow(in *pb.PullRowsRequest, rows func(n int) []float32) (*pb.PullRowsResponse, bool, error) {
	n := 0
	for _, t := range in.Tables {
		n += len(t.Keys)
	}
	if rows == nil {
		return nil, true, status.Error(codes.Internal, "no memory lent for the answer")
	}
	all := rows(n)
	b.mu.Lock()
	b.lent = append(b.lent, &all[0])
	b.mu.Unlock()
	out := &pb.PullRowsResponse{Version: in.MinVersion}
	for _, t := range in.Tables {
		v := all[:len(t.Keys)]
		all = all[len(t.Keys):]
		for i, k := range t.Keys {
			v[i] = float32(k) + 0.5
		}
		out.Tables = append(out.Tables, &pb.RowBlock{Table: t.Table, Values: wire.Bytes(v)})
	}
	return out, true, nil
}

// lendingServer is a server of a lendingBackend, and worker 0's client
// of it.
func lendingServer(t *testing.T) (*lendingBackend, *Client) {
	t.Helper()
	b := &lendingBackend{rowBackend: rowBackend{waited: make(chan context.Context, 1)}}
	keys := auth.NewKeyring(auth.Token("the run's token, thirty-two bytes or more"))
	addr, _ := startAuth(t, b, keys, 1<<20)
	c := signed(addr, keys, auth.RoleWorker, 0, 1<<20)
	t.Cleanup(func() { c.Close() })
	return b, c
}

// TestRowPullsAnswerInTheConnectionsMemory: a shard that can answer at
// once writes a pull's rows into memory its connection lends, the same
// from one pull to the next, and each answer the client holds stays
// its own when the next overwrites that memory.
func TestRowPullsAnswerInTheConnectionsMemory(t *testing.T) {
	b, c := lendingServer(t)
	ctx := context.Background()
	var answers []*pb.PullRowsResponse
	for _, keys := range [][]uint64{{1, 2, 3}, {7, 8}} {
		got, err := c.PullRows(ctx, &pb.PullRowsRequest{RunId: "r", Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: keys}}})
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, got)
	}
	for i, want := range [][]float32{{1.5, 2.5, 3.5}, {7.5, 8.5}} {
		if got, err := wire.Floats(answers[i].Tables[0].Values); err != nil || !slices.Equal(got, want) {
			t.Errorf("pull %d answered %v (%v), want %v", i, got, err, want)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.lent) != 2 || b.lent[0] != b.lent[1] {
		t.Errorf("the connection lent %v for its two answers, want the same memory twice", b.lent)
	}
}

// TestRowConnKeepsLittle: after a request whose decoding or answer took
// more than keepRowBytes (here a payload of 2-byte empty blocks, each a
// decoded block), the connection lets its buffers go.
func TestRowConnKeepsLittle(t *testing.T) {
	var rc rowConn
	empty := make([]*pb.RowBlock, keepRowBytes/blockBytes+1)
	for i := range empty {
		empty[i] = &pb.RowBlock{}
	}
	payload := appendBlocks(nil, fieldRequestTables, empty)
	if _, err := rc.dec.decode(payload, fieldRequestTables); err != nil {
		t.Fatal(err)
	}
	rc.answerRows(keepRowBytes/4 + 1)
	rc.trim()
	if rc.dec.held() != 0 || rc.rows != nil {
		t.Errorf("kept %d bytes of decoding and %d answer values", rc.dec.held(), cap(rc.rows))
	}
	small := appendBlocks(nil, fieldRequestTables, []*pb.RowBlock{{Table: "emb/C1", SmallKeys: []uint64{1, 2}, Values: make([]byte, 8)}})
	if _, err := rc.dec.decode(small, fieldRequestTables); err != nil {
		t.Fatal(err)
	}
	rc.answerRows(2)
	rc.trim()
	if rc.dec.held() == 0 || rc.rows == nil {
		t.Error("a small request's buffers were let go: they are kept for the next")
	}
}

// TestRowPullPlacedHandsTheAnswerOver: PullRowsPlaced gives place the
// answer PullRows would, and place's error is the call's.
func TestRowPullPlacedHandsTheAnswerOver(t *testing.T) {
	_, c := lendingServer(t)
	ctx := context.Background()
	req := &pb.PullRowsRequest{RunId: "r", MinVersion: 4, Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{2, 6}}, {Table: "emb/C2", SmallKeys: []uint64{9}}}}
	want, err := c.PullRows(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var placed bool
	if err := c.PullRowsPlaced(ctx, req, func(got *pb.PullRowsResponse) error {
		placed = true
		if !proto.Equal(got, want) {
			t.Errorf("placed %v, PullRows answered %v", got, want)
		}
		return nil
	}); err != nil || !placed {
		t.Fatalf("placed %t: %v", placed, err)
	}
	refused := status.Error(codes.DataLoss, "rows of the wrong length")
	if err := c.PullRowsPlaced(ctx, req, func(*pb.PullRowsResponse) error { return refused }); err != refused {
		t.Errorf("place's error %v came back as %v", refused, err)
	}
	if _, err := c.PullRows(ctx, req); err != nil {
		t.Errorf("a pull after place's error: %v", err)
	}
}

// orderBackend is rowBackend noting the order its pushes arrive in.
type orderBackend struct {
	rowBackend
	order []string
}

func (b *orderBackend) PushRows(ctx context.Context, in *pb.PushRowsRequest) (*pb.PushRowsResponse, error) {
	b.mu.Lock()
	b.order = append(b.order, fmt.Sprintf("rows %d", in.Tables[0].Keys[0]))
	b.mu.Unlock()
	return b.rowBackend.PushRows(ctx, in)
}

func (b *orderBackend) Push(ctx context.Context, in *pb.PushRequest) (*pb.PushResponse, error) {
	b.mu.Lock()
	b.order = append(b.order, fmt.Sprintf("dense %d bytes", len(in.Grad)))
	b.mu.Unlock()
	return b.fakeBackend.Push(ctx, in)
}

// TestPushAfterRowsTakesTheRowsFirst: a step's row pushes and its dense
// push sent together reach the backend in that order, with the header's
// fields, over the socket and through a shared region, and each answer
// comes back. A refused row push is the call's error, and the dense
// push behind it is refused unapplied (the answers say which rows were
// taken); so is one whose row request the server refused and closed the
// connection on, with that refusal, not the closed connection, as its
// error.
func TestPushAfterRowsTakesTheRowsFirst(t *testing.T) {
	for _, noShm := range []bool{false, true} {
		t.Run(fmt.Sprintf("noShm=%v", noShm), func(t *testing.T) {
			b := &orderBackend{}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			serveTest(t, NewServer(b, lis, Config{MaxPayload: 1 << 20, Log: slog.New(slog.DiscardHandler), NoSharedMemory: noShm}))
			c := client(lis.Addr().String(), 1<<20)
			defer c.Close()
			ctx := context.Background()
			row := func(version int64, k uint64, values int) *pb.PushRowsRequest {
				return &pb.PushRowsRequest{RunId: "r", Worker: 1, Generation: 2, Version: version,
					Tables: []*pb.RowBlock{{Table: "emb/C1", Keys: []uint64{k}, Values: make([]byte, values)}}}
			}
			grad := []float32{1, 2, 3}
			got, resp, err := c.PushAfterRows(ctx, []*pb.PushRowsRequest{row(4, 7, 4), row(4, 8, 4)},
				&pb.PushRequest{RunId: "r", Worker: 1, Version: 4, Loss: 0.5}, [][]float32{grad[:2], grad[2:]})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || got[0].Outcome != pb.PushResponse_STALE || got[1].Version != 7 || !got[1].Done ||
				resp.Outcome != pb.PushResponse_DUPLICATE || resp.Version != 4+12 || resp.Done {
				t.Fatalf("answered %v and %v", got, resp)
			}
			// The middle row push refused: the others taken, the dense
			// push (its gradient in Grad) refused.
			got, resp, err = c.PushAfterRows(ctx, []*pb.PushRowsRequest{row(5, 9, 4), row(-1, 10, 4), row(5, 11, 4)},
				&pb.PushRequest{RunId: "r", Worker: 1, Version: 5, Grad: make([]byte, 8)}, nil)
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "a push from a negative version" || resp != nil {
				t.Fatalf("a refused row push: %v, %v", resp, err)
			}
			if len(got) != 3 || got[0] == nil || got[1] != nil || got[2] == nil {
				t.Fatalf("answers %v: want the first and last rows' only", got)
			}
			// Sent again, the refused row alone: the dense push is taken.
			if _, _, err := c.PushAfterRows(ctx, []*pb.PushRowsRequest{row(5, 10, 4)},
				&pb.PushRequest{RunId: "r", Worker: 1, Version: 5, Grad: make([]byte, 8)}, nil); err != nil {
				t.Fatal(err)
			}
			// A row request over the server's limit: refused, the
			// connection closed, the dense push never read.
			_, _, err = c.PushAfterRows(ctx, []*pb.PushRowsRequest{row(6, 12, 2<<20)},
				&pb.PushRequest{RunId: "r", Worker: 1, Version: 6, Grad: make([]byte, 4)}, nil)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("a row request over the limit: %v, want its refusal (InvalidArgument)", err)
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			want := []string{"rows 7", "rows 8", "dense 12 bytes", "rows 9", "rows 10", "rows 11", "rows 10", "dense 8 bytes"}
			if !slices.Equal(b.order, want) {
				t.Fatalf("the backend took %q, want %q", b.order, want)
			}
			if b.fakeBackend.pushes != 2 || b.rowBackend.pushes[1].Version != 4 || b.rowBackend.pushes[1].Worker != 1 || b.rowBackend.pushes[1].Generation != 2 {
				t.Fatalf("the row pushes reached the backend as %v", b.rowBackend.pushes)
			}
		})
	}
}
