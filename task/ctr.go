package task

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/retry"
	"github.com/pstrain/pstrain/ml/ctr"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/nn"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/rowclient"
	"github.com/pstrain/pstrain/worker"
)

// buildNet is the worker's net for spec: a CTR model's over the rows of
// the first psCount shards (rowclient), else package nn's.
func (w *Worker) buildNet(d WorkerDeps, runID string, psCount int) (worker.Net, error) {
	if d.Spec.IsCTR() {
		return w.ctrNet(d.Spec, runID, psCount)
	}
	net, err := build(d.Builds, func() (*nn.Net, error) { return nn.New(d.Spec, w.o.Run.Batch, true) })
	if err != nil {
		return nil, err
	}
	w.closers.add(func() { net.Close() })
	return net, nil
}

// ctrNet is a CTR worker's net: ctr.Net reading and training its rows
// on the first psCount shards through a rowclient of connections of its
// own, beside the dense model's: on the TCP data plane a data-plane
// client of each PS (ops 4 and 5, docs/wire.md), its row pushes sent
// instead ahead of each shard's dense push (CTRNet.RideRows), else
// gRPC. Under --data-plane-privacy integrity the rows stay on gRPC's
// full TLS: they are the training data's keys, which that mode would
// send in the clear. It dials every PS slot of the cluster, so that a
// change of the PS count only builds a new client (rowsFor).
func (w *Worker) ctrNet(spec model.Spec, runID string, psCount int) (worker.Net, error) {
	cl := w.o.Cluster
	for i, a := range cl.PS {
		rc, gc, err := w.rowConn(a)
		if err != nil {
			return nil, err
		}
		if len(cl.Standby) == 0 {
			w.rowConns = append(w.rowConns, rc)
			continue
		}
		// A shard with a hot standby: its row client switches process as
		// its dense client does (docs/replication.md).
		src, sgc, err := w.rowConn(cl.Standby[i])
		if err != nil {
			return nil, err
		}
		w.rowConns = append(w.rowConns, worker.NewRowFailover(i,
			worker.Process{Task: cluster.Task{Type: cluster.PS, Index: i}.String(), Addr: a, Role: roleOf(gc)},
			worker.Process{Task: cluster.Task{Type: cluster.Standby, Index: i}.String(), Addr: cl.Standby[i], Role: roleOf(sgc)},
			[2]rowclient.Shard{rc, src}, w.o.Log))
	}
	rows, err := w.rowsFor(runID, psCount)
	if err != nil {
		return nil, err
	}
	net, err := ctr.New(spec, w.o.Run.Batch, true)
	if err != nil {
		return nil, err
	}
	if w.ctr, err = worker.NewCTRNet(net, rows); err != nil {
		return nil, err
	}
	if rowsOnDataPlane(w.o.Run) {
		// Each shard's rows go ahead of its dense push, on the dense
		// push's data-plane connection: one round trip for both.
		if err := w.ctr.RideRows(); err != nil {
			return nil, err
		}
	}
	return w.ctr, nil
}

// rowConn connects to the PS at addr for rows: its row client and its
// gRPC client.
func (w *Worker) rowConn(addr string) (rowclient.Shard, pb.ParameterServerClient, error) {
	c, err := w.o.dial(addr)
	if err != nil {
		return nil, nil, err
	}
	w.closers.add(func() { c.Close() })
	gc := pb.NewParameterServerClient(c)
	if !rowsOnDataPlane(w.o.Run) {
		return gc, gc, nil
	}
	dp := newDataPlaneClient(gc, w.o.dataPlaneDeps(), nil)
	w.closers.add(func() { dp.Close() })
	return dp, gc, nil
}

// rowsOnDataPlane says whether a CTR worker's rows travel on the TCP
// data plane: with --data-plane tcp, unless --data-plane-privacy
// integrity would carry their keys in the clear.
func rowsOnDataPlane(r config.Run) bool {
	return r.DataPlane == config.TCP && r.DataPlanePrivacy != config.Integrity
}

// rowsFor is a CTR worker's client of the rows of the first n shards:
// a key's row is on shard embed.ShardOf(table, key, n).
func (w *Worker) rowsFor(runID string, n int) (*rowclient.Client, error) {
	if n < 1 || n > len(w.rowConns) {
		return nil, fmt.Errorf("worker: the rows of %d parameter servers; the cluster lists %d", n, len(w.rowConns))
	}
	return rowclient.New(rowclient.Config{Shards: w.rowConns[:n:n], RunID: runID, Worker: int32(w.o.Task.Index),
		Retry: retryUnavailable(w.o.ConnectTimeout)})
}

// retryUnavailable is a CTR worker's rowclient retry: a request that
// found its shard unavailable (restarting, or restored and loading its
// rows) is made again, with backoff, for up to patience, as the
// worker's dense calls are. Each request to one shard is retried alone:
// a push is never sent again to the shards that took it.
func retryUnavailable(patience time.Duration) func(context.Context, func(context.Context) error) error {
	p := retry.Policy{First: 20 * time.Millisecond, Max: time.Second, Patience: patience, Retryable: retry.OnCodes(codes.Unavailable)}
	return func(ctx context.Context, call func(context.Context) error) error { return retry.Do(ctx, p, call) }
}

// ctrTrainN is how many training samples a CTR run trains on: the
// first --data-fraction of the training split.
func ctrTrainN(r config.Run, train ctrdata.Source) int {
	n := train.Len()
	if r.DataFraction < 1 {
		n = dataset.SubsetSize(r.DataFraction, n)
	}
	return n
}

// ctrLoader reads a CTR worker's data shards: shard index of count is
// the index-th of count contiguous ranges of the run's training samples
// (ctrTrainN), held in memory (worker.CTRSamples).
func ctrLoader(r config.Run, train ctrdata.Source) dataset.ShardLoader {
	n := ctrTrainN(r, train)
	return func(index, count int) (dataset.Samples, error) {
		if count < 1 || index < 0 || index >= count {
			return nil, fmt.Errorf("data: shard %d of %d", index, count)
		}
		lo, hi := index*n/count, (index+1)*n/count
		return readRange(train, lo, hi)
	}
}

// readRange reads samples [lo, hi) of src into a shard held compactly
// (worker.CTRSamples), a chunk at a time: the samples are never held
// twice.
func readRange(src ctrdata.Source, lo, hi int) (*worker.CTRSamples, error) {
	st, err := src.Open(lo, hi)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	all := worker.NewCTRSamplesCap(src.Schema(), hi-lo)
	chunk := ctrdata.NewBatch(src.Schema(), min(max(hi-lo, 1), 4096))
	for {
		err := st.Next(chunk)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if err := all.Append(chunk); err != nil {
			return nil, fmt.Errorf("data: samples [%d, %d): %w", lo, hi, err)
		}
	}
	if n, _ := all.Shape(); n != hi-lo {
		return nil, fmt.Errorf("data: read %d samples of [%d, %d)", n, lo, hi)
	}
	return all, nil
}
