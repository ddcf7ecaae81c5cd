package rowclient

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	pb "github.com/pstrain/pstrain/proto"
)

// loadRecorder is a shard that records the LoadRows requests it gets.
type loadRecorder struct {
	pb.ParameterServerClient
	got []*pb.LoadRowsRequest
}

func (l *loadRecorder) LoadRows(_ context.Context, req *pb.LoadRowsRequest, _ ...grpc.CallOption) (*pb.LoadRowsResponse, error) {
	l.got = append(l.got, req)
	return &pb.LoadRowsResponse{}, nil
}

// TestLoadShardSaysTheRowsToCome: each LoadRows request says how many
// rows of its table are still to come, counting every part the table
// comes in, so the shard makes room once; the release comes last.
func TestLoadShardSaysTheRowsToCome(t *testing.T) {
	part := func(name string, n, first int) shardckpt.TableRows {
		r := shardckpt.TableRows{Name: name, Kind: "sgd", Dim: 2}
		for i := range n {
			r.Keys = append(r.Keys, uint64(first+i))
			r.Values = append(r.Values, 1, 2)
		}
		return r
	}
	rows := []shardckpt.TableRows{part("a", 5, 0), part("b", 3, 0), part("a", 4, 100)}
	var cl loadRecorder
	// 2 rows a request: 8+4*2 bytes a row.
	if err := LoadShard(context.Background(), &cl, rows, "r", 1, 32); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, req := range cl.got {
		if req.Done {
			got = append(got, "done")
			continue
		}
		got = append(got, fmt.Sprintf("%s %d of %d", req.Table, len(req.Keys), req.RowsToCome))
	}
	want := []string{"a 2 of 9", "a 2 of 7", "a 1 of 5", "b 2 of 3", "b 1 of 1", "a 2 of 4", "a 2 of 2", "done"}
	if !slices.Equal(got, want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
}
