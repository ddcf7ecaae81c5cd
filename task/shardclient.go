package task

import (
	"context"
	"crypto/tls"

	"google.golang.org/grpc"

	"github.com/pstrain/pstrain/config"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
	"github.com/pstrain/pstrain/transport/dataplane"
	"github.com/pstrain/pstrain/transport/rowclient"
	"github.com/pstrain/pstrain/worker"
)

// How a task reaches a PS process beyond its gRPC connection. The role
// constructors build their shard clients with these; workerClients also
// serves the in-process cluster's own worker connections
// (testcluster.Cluster.Dial, for bench).

// dataPlaneConf is what a data-plane client of a PS depends on.
type dataPlaneConf struct {
	TLS        *tls.Config // the client's TLS (nil: plain TCP)
	MaxPayload int         // the largest payload it reads or writes
	Sign       *auth.Client
}

// newDataPlaneClient is a data-plane client of the PS that gc reaches.
// The PS reports where its data plane listens in Status, asked again
// after every broken connection; resolved, if not nil, hears every
// address it reports ("": the PS has no data plane). Requests are signed
// with d.Sign's session.
func newDataPlaneClient(gc pb.ParameterServerClient, d dataPlaneConf, resolved func(addr string)) *dataplane.Client {
	c := dataplane.NewClient(func(ctx context.Context) (string, error) {
		st, err := gc.Status(ctx, &pb.StatusRequest{})
		if err != nil {
			return "", err
		}
		if resolved != nil {
			resolved(st.DataAddr)
		}
		return st.DataAddr, nil
	}, d.TLS, d.MaxPayload)
	c.SignWith(d.Sign)
	return c
}

// pullsVia is gc with its pulls sent over dp and everything else over
// gRPC: the chief's evaluation pulls (on gRPC each would cost the PS a
// copy of its parameters that cannot be reused, and a marshalling
// buffer), and with rows its reads of a CTR model's rows (the PS's
// HTTP/2 framing cost as much as the rows' own work).
func pullsVia(gc pb.ParameterServerClient, dp *dataplane.Client, rows bool) pb.ParameterServerClient {
	return pullsViaDataPlane{gc, dp, rows}
}

// chiefClient is the chief's client of a PS on the TCP data plane: gc
// with its pulls, and its row reads where a worker's rows would go
// (rowsOnDataPlane), sent over dp.
func chiefClient(r config.Run, gc pb.ParameterServerClient, dp *dataplane.Client) pb.ParameterServerClient {
	return pullsVia(gc, dp, rowsOnDataPlane(r))
}

// pullsViaDataPlane is pullsVia's client; a rowclient.Placer.
type pullsViaDataPlane struct {
	pb.ParameterServerClient
	dp   *dataplane.Client
	rows bool
}

func (p pullsViaDataPlane) Pull(ctx context.Context, in *pb.PullRequest, _ ...grpc.CallOption) (*pb.PullResponse, error) {
	return p.dp.Pull(ctx, in)
}

func (p pullsViaDataPlane) PullRows(ctx context.Context, in *pb.PullRowsRequest, opts ...grpc.CallOption) (*pb.PullRowsResponse, error) {
	if p.rows {
		return p.dp.PullRows(ctx, in)
	}
	return p.ParameterServerClient.PullRows(ctx, in, opts...)
}

// PullRowsPlaced hands place the answer to a row pull (rowclient.Placer):
// in the data-plane client's buffers, or gRPC's message.
func (p pullsViaDataPlane) PullRowsPlaced(ctx context.Context, in *pb.PullRowsRequest, place func(*pb.PullRowsResponse) error) error {
	if p.rows {
		return p.dp.PullRowsPlaced(ctx, in, place)
	}
	return rowclient.PullPlaced(ctx, p.ParameterServerClient, in, place)
}

// workerClients are a worker's clients of the PS process gc reaches: on
// the TCP data plane (tcp) two data-plane clients, one for its pushes
// and one for its pulls (worker.Shard.Puller: a pull can wait at the PS
// while the step's push is under way), else gc for both (a gRPC
// connection carries concurrent calls). close closes the data-plane
// clients; gc goes with its connection.
func workerClients(gc pb.ParameterServerClient, tcp bool, d dataPlaneConf) (push, pull worker.DataPlane, close func()) {
	if !tcp {
		return gc, gc, func() {}
	}
	pc, lc := newDataPlaneClient(gc, d, nil), newDataPlaneClient(gc, d, nil)
	return pc, lc, func() { pc.Close(); lc.Close() }
}
