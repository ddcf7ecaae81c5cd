package bench

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/dataplane"
	"github.com/pstrain/pstrain/metrics"
	"github.com/pstrain/pstrain/model"
	"github.com/pstrain/pstrain/partition"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/wire"
	"github.com/pstrain/pstrain/worker"
)

// maxMessageBytes matches the tasks' default --max-message-mb.
const maxMessageBytes = 256 << 20

// tcpCluster is run.PS shard servers served over real loopback TCP
// listeners in this process, with one client connection each, as the
// tasks set them up (same message size limits, default gRPC options).
type tcpCluster struct {
	plan    partition.Plan
	shards  []worker.Shard
	servers []*grpc.Server
	conns   []*grpc.ClientConn
	data    []*dataplane.Server // run.DataPlane "tcp": the workers' path
	clients []*dataplane.Client
	wg      sync.WaitGroup
}

// startTCPCluster starts and initialises the shards with spec.Init(seed).
// Close stops every server and connection.
func startTCPCluster(ctx context.Context, run config.Run, spec model.Spec, maxVersion int64) (*tcpCluster, error) {
	return startTCPClusterWith(ctx, run, spec, maxVersion, nil)
}

// startTCPClusterWith is startTCPCluster with shard s's metrics recorded
// in psMetrics(s) (nil: unregistered ones).
func startTCPClusterWith(ctx context.Context, run config.Run, spec model.Spec, maxVersion int64, psMetrics func(s int) *metrics.PS) (*tcpCluster, error) {
	plan, err := partition.New(spec, run.PS)
	if err != nil {
		return nil, err
	}
	c := &tcpCluster{plan: plan}
	init := spec.Init(uint64(run.Seed))
	log := slog.New(slog.DiscardHandler)
	for s := 0; s < run.PS; s++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("bench: ps listener: %w", err)
		}
		g := grpc.NewServer(grpc.MaxRecvMsgSize(maxMessageBytes), grpc.MaxSendMsgSize(maxMessageBytes))
		var m *metrics.PS
		if psMetrics != nil {
			m = psMetrics(s)
		}
		srv := ps.NewServer(log, m, nil)
		pb.RegisterParameterServerServer(g, srv)
		c.servers = append(c.servers, g)
		c.wg.Add(1)
		go func() { defer c.wg.Done(); _ = g.Serve(lis) }() // returns on Stop
		addr := lis.Addr().String()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("bench: dial ps %s: %w", addr, err)
		}
		c.conns = append(c.conns, conn)
		client := pb.NewParameterServerClient(conn)
		flat := make([]float32, plan.Shards[s].Size)
		plan.Gather(s, init, flat)
		if _, err := client.Init(ctx, &pb.InitRequest{RunId: "bench", Shard: int32(s), NumShards: int32(run.PS),
			RunConfig: run.JSON(), Params: wire.Bytes(flat), MaxVersion: maxVersion}); err != nil {
			c.Close()
			return nil, fmt.Errorf("bench: init ps %s: %w", addr, err)
		}
		var dp worker.DataPlane = client
		if run.DataPlane == "tcp" {
			dl, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("bench: data plane listener: %w", err)
			}
			ds := dataplane.NewServer(srv, dl, maxMessageBytes, log)
			c.data = append(c.data, ds)
			c.wg.Add(1)
			go func() { defer c.wg.Done(); _ = ds.Serve() }()
			daddr := dl.Addr().String()
			dc := dataplane.NewClient(func(context.Context) (string, error) { return daddr, nil }, nil, maxMessageBytes)
			c.clients = append(c.clients, dc)
			dp = dc
		}
		c.shards = append(c.shards, worker.Shard{Addr: addr, Client: dp})
	}
	return c, nil
}

// Close stops the servers and closes the connections, and waits for the
// serving goroutines.
func (c *tcpCluster) Close() {
	for _, dc := range c.clients {
		dc.Close()
	}
	for _, ds := range c.data {
		ds.Close()
	}
	for _, conn := range c.conns {
		conn.Close()
	}
	for _, g := range c.servers {
		g.Stop()
	}
	c.wg.Wait()
}
