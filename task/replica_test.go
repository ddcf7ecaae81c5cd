package task

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/dataplane"
)

// statusOnly is a standby's gRPC API as the replica client uses it: its
// Status reports dataAddr, and its Replicate is counted.
type statusOnly struct {
	pb.ParameterServerClient
	dataAddr   string
	replicates int
}

func (s *statusOnly) Status(context.Context, *pb.StatusRequest, ...grpc.CallOption) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{DataAddr: s.dataAddr}, nil
}

func (s *statusOnly) Replicate(_ context.Context, b *pb.ReplicaBatch, _ ...grpc.CallOption) (*pb.ReplicaAck, error) {
	s.replicates++
	return &pb.ReplicaAck{Seq: b.FirstSeq}, nil
}

// countingStandby is a data-plane backend that acknowledges batches and
// counts them.
type countingStandby struct {
	dataplane.Backend
	n chan int64
}

func (c countingStandby) Replicate(_ context.Context, b *pb.ReplicaBatch) (*pb.ReplicaAck, error) {
	c.n <- b.FirstSeq
	return &pb.ReplicaAck{Seq: b.FirstSeq, Version: 9}, nil
}

func batch(seq int64) *pb.ReplicaBatch {
	return &pb.ReplicaBatch{RunId: "r", FirstSeq: seq, Ops: []*pb.ReplicaOp{{Op: &pb.ReplicaOp_Stop{Stop: &pb.StopRequest{}}}}}
}

// A primary sends its batches over the standby's data plane, and over
// gRPC when the standby reports none.
func TestReplicaClientUsesTheStandbysDataPlane(t *testing.T) {
	ctx := context.Background()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int64, 1)
	ds := dataplane.NewServer(countingStandby{n: got}, lis, dataplane.Config{MaxPayload: 1 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	go ds.Serve()
	defer ds.Close()
	o := Options{MaxMessageBytes: 1 << 20}

	with := &statusOnly{dataAddr: lis.Addr().String()}
	rc := &replicaViaDataPlane{grpc: with}
	rc.dp = o.dataPlaneClientWith(with, rc.resolved)
	defer rc.dp.Close()
	ack, err := rc.Replicate(ctx, batch(4))
	if err != nil || ack.Seq != 4 || ack.Version != 9 {
		t.Fatalf("over the data plane: %v, %v", ack, err)
	}
	if seq := <-got; seq != 4 || with.replicates != 0 {
		t.Fatalf("the standby's data plane got batch %d, its gRPC API %d batches", seq, with.replicates)
	}

	without := &statusOnly{}
	rc = &replicaViaDataPlane{grpc: without}
	rc.dp = o.dataPlaneClientWith(without, rc.resolved)
	defer rc.dp.Close()
	for seq := int64(1); seq <= 2; seq++ {
		if ack, err := rc.Replicate(ctx, batch(seq)); err != nil || ack.Seq != seq {
			t.Fatalf("a standby without a data plane: %v, %v", ack, err)
		}
	}
	if without.replicates != 2 {
		t.Fatalf("%d of 2 batches went over gRPC to a standby without a data plane", without.replicates)
	}
}
