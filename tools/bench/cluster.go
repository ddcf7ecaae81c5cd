package bench

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/testcluster"
	"github.com/pstrain/pstrain/worker"
)

// tcpCluster is run.PS shard servers served over real loopback TCP
// listeners in this process (testcluster.Loopback), as the tasks set them up
// (same message size limits, default gRPC options), with the connections
// of one worker process: a gRPC connection per shard and, on the TCP data
// plane, a data-plane client per shard.
type tcpCluster struct {
	*testcluster.Cluster
	plan   partition.Plan
	shards []worker.Shard
}

// startTCPCluster starts and initialises the shards with spec.Init(seed).
// Close stops every server and connection.
func startTCPCluster(ctx context.Context, run config.Run, spec model.Spec, maxVersion int64) (*tcpCluster, error) {
	return startTCPClusterWith(ctx, run, spec, maxVersion, nil)
}

// startTCPClusterWith is startTCPCluster with shard s's metrics recorded
// in psMetrics(s) (nil: unregistered ones).
func startTCPClusterWith(ctx context.Context, run config.Run, spec model.Spec, maxVersion int64, psMetrics func(s int) *metrics.PS) (*tcpCluster, error) {
	cl, err := testcluster.Start(ctx, testcluster.Config{Run: run, Spec: spec, RunID: "bench", Transport: testcluster.Loopback,
		MaxVersion: maxVersion, PSMetrics: psMetrics, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	shards, err := cl.Dial()
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	return &tcpCluster{Cluster: cl, plan: cl.Plan(), shards: shards}, nil
}
