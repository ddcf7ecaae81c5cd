package dataplane

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pstrain/pstrain/proto"
)

// ack acknowledges a batch without applying it: the benchmark measures
// the transport alone.
func ack(_ context.Context, b *pb.ReplicaBatch) (*pb.ReplicaAck, error) {
	return &pb.ReplicaAck{Seq: b.FirstSeq + int64(len(b.Ops)) - 1}, nil
}

// ackingStandby is ack as a data-plane backend, grpcStandby as a gRPC
// service.
type ackingStandby struct{ fakeBackend }

func (*ackingStandby) Replicate(ctx context.Context, b *pb.ReplicaBatch) (*pb.ReplicaAck, error) {
	return ack(ctx, b)
}

type grpcStandby struct {
	pb.UnimplementedParameterServerServer
}

func (grpcStandby) Replicate(ctx context.Context, b *pb.ReplicaBatch) (*pb.ReplicaAck, error) {
	return ack(ctx, b)
}

// tcpOnly hides a TCP listener's type, so that the server opens no
// same-host socket beside it and clients dial TCP.
type tcpOnly struct{ net.Listener }

// BenchmarkReplicate is one Replicate call of a batch holding one push
// of the default model's shard (318,010 float32 values: 1.27 MB), in
// process, over gRPC on loopback TCP (what --data-plane grpc uses, and
// every run did before op 3) and over the data plane on loopback TCP, on
// its same-host socket with the payload through the socket, and with the
// payload in the connection's shared region (what `pstrain run` uses).
func BenchmarkReplicate(b *testing.B) {
	const size = 318010 * 4
	batch := &pb.ReplicaBatch{RunId: "r", Epoch: 1, FirstSeq: 2, Ops: []*pb.ReplicaOp{pushOp(0, make([]byte, size))}}
	listen := func(b *testing.B) net.Listener {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		return lis
	}
	run := func(b *testing.B, replicate func(context.Context, *pb.ReplicaBatch, ...grpc.CallOption) (*pb.ReplicaAck, error)) {
		b.SetBytes(size)
		b.ReportAllocs()
		ctx := context.Background()
		for range b.N {
			if _, err := replicate(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("grpc", func(b *testing.B) {
		lis := listen(b)
		g := grpc.NewServer(grpc.MaxRecvMsgSize(16 << 20))
		pb.RegisterParameterServerServer(g, grpcStandby{})
		go g.Serve(lis)
		defer g.Stop()
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		run(b, pb.NewParameterServerClient(conn).Replicate)
	})
	for _, plane := range []struct {
		name       string
		local, shm bool
	}{{"dataplane-tcp", false, false}, {"dataplane-unix", true, false}, {"dataplane-shm", true, true}} {
		b.Run(plane.name, func(b *testing.B) {
			var lis net.Listener = tcpOnly{listen(b)}
			if plane.local {
				lis = lis.(tcpOnly).Listener
			}
			s := NewServer(&ackingStandby{}, lis, Config{MaxPayload: 16 << 20, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), NoSharedMemory: !plane.shm})
			s.SetPushSize(size)
			go s.Serve()
			defer s.Close()
			c := client(lis.Addr().String(), 16<<20)
			defer c.Close()
			run(b, c.Replicate)
		})
	}
}
