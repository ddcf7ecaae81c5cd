package dataplane

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	pb "github.com/pstrain/pstrain/proto"
)

// deltaBackend is fakeBackend that keeps the pull requests it gets.
type deltaBackend struct {
	*fakeBackend
	pulls []*pb.PullRequest
}

func (d *deltaBackend) PullShared(ctx context.Context, r *pb.PullRequest) (*pb.PullResponse, func(), error) {
	d.mu.Lock()
	d.pulls = append(d.pulls, r)
	d.mu.Unlock()
	return d.fakeBackend.PullShared(ctx, r)
}

// A pull's delta and delta base (--compress) cross the data plane: the
// flag, and the base in the data position field; a pull without it
// carries neither. The request reader accepts the flag on a pull only.
func TestDeltaPullCarriesItsBase(t *testing.T) {
	b := &deltaBackend{fakeBackend: &fakeBackend{release: make(chan struct{}), pullCtx: make(chan context.Context, 1)}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveTest(t, NewServer(b, lis, Config{MaxPayload: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	c := client(lis.Addr().String(), 1<<20)
	defer c.Close()
	for _, in := range []*pb.PullRequest{{Worker: 1, RunId: "r", Delta: true, DeltaBase: 1<<62 + 5}, {Worker: 1, RunId: "r"}} {
		if _, err := c.Pull(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.pulls) != 2 || !b.pulls[0].Delta || b.pulls[0].DeltaBase != 1<<62+5 || b.pulls[1].Delta || b.pulls[1].DeltaBase != 0 {
		t.Fatalf("the server got %v", b.pulls)
	}
	push := appendSigned(nil, request{op: opPush, delta: true, runID: "r", payloadLen: 4}, nil)
	if _, err := readRequest(bytes.NewReader(push), make([]byte, 512), 64); err == nil {
		t.Fatal("a push with the delta flag was accepted")
	}
}
