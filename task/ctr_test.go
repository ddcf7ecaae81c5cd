package task

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/dataplane"
	"github.com/pstrain/pstrain/transport/rowclient"
)

// TestRowsTravelOnTheDataPlaneUnlessTheyWouldGoInTheClear: a CTR
// worker's rows take the TCP data plane whenever the run does, plain or
// encrypted, and gRPC's TLS when the data plane would authenticate
// their keys without encrypting them. (A silent fallback to gRPC trains
// the same model, slower: TestCTRRowsOverEveryPlaneTrainTheSameModel
// cannot see it.)
func TestRowsTravelOnTheDataPlaneUnlessTheyWouldGoInTheClear(t *testing.T) {
	for _, c := range []struct {
		plane   config.DataPlane
		privacy config.Privacy
		want    bool
	}{
		{config.TCP, "", true},
		{config.TCP, config.Encrypt, true},
		{config.TCP, config.Integrity, false},
		{config.GRPC, config.Encrypt, false},
		{config.GRPC, config.Integrity, false},
	} {
		r := config.Default()
		r.DataPlane, r.DataPlanePrivacy = c.plane, c.privacy
		if got := rowsOnDataPlane(r); got != c.want {
			t.Errorf("--data-plane %s, privacy %q: rows on the data plane %t, want %t", c.plane, c.privacy, got, c.want)
		}
	}
}

// recordingPS is a ParameterServerClient that answers row pulls and
// counts them; every other call panics (nil embedded interface).
type recordingPS struct {
	pb.ParameterServerClient
	rowPulls int
}

func (r *recordingPS) PullRows(context.Context, *pb.PullRowsRequest, ...grpc.CallOption) (*pb.PullRowsResponse, error) {
	r.rowPulls++
	return &pb.PullRowsResponse{Version: 3}, nil
}

// The chief's client of a PS reads rows over the data plane where a
// worker's rows travel there (--data-plane-privacy encrypt), else over
// gRPC (integrity: the keys would go in the clear), both ways: PullRows
// and the placed pull a rowclient prefers.
func TestChiefReadsRowsWhereWorkersSendThem(t *testing.T) {
	refused := errors.New("no data plane here")
	dp := dataplane.NewClient(func(context.Context) (string, error) { return "", refused }, nil, 1<<20)
	defer dp.Close()
	ctx := context.Background()
	for _, rows := range []bool{false, true} {
		gc := &recordingPS{}
		r := config.Default()
		r.DataPlane, r.DataPlanePrivacy = config.TCP, config.Integrity
		if rows {
			r.DataPlanePrivacy = config.Encrypt
		}
		c := chiefClient(r, gc, dp).(rowclient.Placer)
		_, err1 := c.(pb.ParameterServerClient).PullRows(ctx, &pb.PullRowsRequest{})
		err2 := c.PullRowsPlaced(ctx, &pb.PullRowsRequest{}, func(*pb.PullRowsResponse) error { return nil })
		switch {
		case rows && (gc.rowPulls != 0 || !errors.Is(err1, refused) || !errors.Is(err2, refused)):
			t.Errorf("rows on the data plane: %d gRPC row pulls, errors %v, %v; want none, and the data plane's", gc.rowPulls, err1, err2)
		case !rows && (gc.rowPulls != 2 || err1 != nil || err2 != nil):
			t.Errorf("rows on gRPC: %d gRPC row pulls, errors %v, %v; want 2 and none", gc.rowPulls, err1, err2)
		}
	}
}
