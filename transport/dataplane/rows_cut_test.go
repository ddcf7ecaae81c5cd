package dataplane

import (
	"bufio"
	"context"
	"io"
	"net"
	"slices"
	"sync"
	"testing"

	pb "github.com/pstrain/pstrain/proto"
)

// TestPushAfterRowsCutMidwayKeepsTheAnswersThatCame: a server that
// takes a call's first row push, answers it and resets the connection
// (as one cutting a slow frame does) leaves the call with an error and
// that row marked taken, and the client does not send the call again
// on its own (which would apply the taken row twice on an async
// shard): the caller sends again what was not taken.
func TestPushAfterRowsCutMidwayKeepsTheAnswersThatCame(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var mu sync.Mutex
	var rowsSeen []int64 // the versions of the row pushes the server read
	go func() {
		for n := 0; ; n++ {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func(n int, c net.Conn) {
				defer c.Close()
				rd := bufio.NewReader(c)
				scratch := make([]byte, 512)
				for reqs := 1; ; reqs++ {
					r, err := readRequest(rd, scratch, 64<<20)
					if err != nil {
						return
					}
					if _, err := io.CopyN(io.Discard, rd, int64(r.payloadLen)); err != nil {
						return
					}
					if r.op == opPushRows {
						mu.Lock()
						rowsSeen = append(rowsSeen, r.version)
						mu.Unlock()
					}
					c.Write(appendResponse(nil, response{version: r.version}))
					if n == 0 && reqs == 3 { // the second call's first row push
						c.(*net.TCPConn).SetLinger(0)
						return
					}
				}
			}(n, c)
		}
	}()
	c := client(lis.Addr().String(), 64<<20)
	defer c.Close()
	ctx := context.Background()
	row := func(v int64) *pb.PushRowsRequest {
		return &pb.PushRowsRequest{RunId: "r", Worker: 1, Version: v, Tables: []*pb.RowBlock{{Table: "t", Keys: []uint64{1}, Values: make([]byte, 4)}}}
	}
	if _, _, err := c.PushAfterRows(ctx, []*pb.PushRowsRequest{row(1)}, &pb.PushRequest{RunId: "r", Version: 1, Grad: make([]byte, 4)}, nil); err != nil {
		t.Fatal(err)
	}
	// (A dense gradient too large for the socket's buffers: its write
	// fails once the server is gone.)
	ans, _, err := c.PushAfterRows(ctx, []*pb.PushRowsRequest{row(2), row(3)}, &pb.PushRequest{RunId: "r", Version: 2, Grad: make([]byte, 32<<20)}, nil)
	mu.Lock()
	defer mu.Unlock()
	if err == nil || len(ans) != 2 || ans[0] == nil || ans[1] != nil {
		t.Fatalf("a call cut after its first row: answers %v, err %v; want an error, the first row taken", ans, err)
	}
	if !slices.Equal(rowsSeen, []int64{1, 2}) {
		t.Fatalf("the server read the row pushes of versions %v, want [1 2] (none sent again)", rowsSeen)
	}
}
