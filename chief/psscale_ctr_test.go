package chief

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
)

// A CTR run's PS count may change (its rows move with the layout,
// psscale.go); a rebalance is refused, saying why: weights move the
// dense blocks only, and a row's shard depends on the count alone.
func TestCTRScalesPSButIsNotRebalanced(t *testing.T) {
	r := ctrRun(2)
	r.MaxPS = 3
	spec := r.CTRSpec(13, 4)
	if len(spec.Tables()) == 0 {
		t.Fatal("the CTR spec has no tables")
	}
	now := time.Unix(1_000_000, 0)
	c := NewCore(CoreParams{Run: r, TrainN: 1000, Model: spec.String(), Spec: spec, Checkpoints: true, StartupTimeout: time.Minute},
		"run-test", slog.New(slog.NewTextHandler(io.Discard, nil)), metrics.NewChief(prometheus.NewRegistry()), now)
	if err := c.ScalePS(3, now); err != nil || c.PSTarget() != 3 {
		t.Fatalf("ScalePS(3) of a CTR run: %v, target %d", err, c.PSTarget())
	}
	if err := c.ScalePS(2, now); err != nil {
		t.Fatal(err)
	}
	err := c.Rebalance([]int{1, 3}, 1.5, now)
	if !errors.Is(err, ErrScale) || !strings.Contains(err.Error(), "hash of their key") {
		t.Errorf("Rebalance of a CTR run: %v, want ErrScale saying the rows are placed by key", err)
	}
}

// rowsPS is a PS process as a CTR move sees it: its Init loads the
// shard's rows from the checkpoint; the first failInits Inits fail as a
// killed process's would (Unavailable), and the process comes back
// empty, with no rows to keep.
type rowsPS struct {
	pb.ParameterServerClient
	mu        sync.Mutex
	failInits int
	inits     []*pb.InitRequest
	loads     int // LoadRows requests
}

func (f *rowsPS) Init(_ context.Context, req *pb.InitRequest, _ ...grpc.CallOption) (*pb.InitResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inits = append(f.inits, req)
	if f.failInits > 0 {
		f.failInits--
		return nil, status.Error(codes.Unavailable, "the process died during its load")
	}
	kept := req.KeepRows && len(f.inits) == 1
	return &pb.InitResponse{RowsKept: kept, RowsLoaded: 3}, nil
}

func (f *rowsPS) LoadRows(context.Context, *pb.LoadRowsRequest, ...grpc.CallOption) (*pb.LoadRowsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads++
	return &pb.LoadRowsResponse{}, nil
}

// A moved CTR shard's Init asks it to load its rows from the boundary's
// checkpoint, keeping those it holds; the chief sends no rows. A shard
// whose process dies during that load is initialised again once it
// answers, with the same request: back empty, it loads all its rows.
func TestMovedShardLoadsItsRowsFromTheCheckpoint(t *testing.T) {
	for _, fails := range []int{0, 1} {
		r := ctrRun(1)
		f := &rowsPS{failInits: fails}
		c, err := New(Config{Run: r, Spec: r.CTRSpec(13, 4), RunID: "run-1", PS: []PS{{Addr: "ps0:1", Client: f}},
			Metrics: metrics.NewChief(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		mv := &move{step: 40, layout: partition.Layout{PS: 1}, shards: []shardInit{{params: make([]float32, c.plan.Shards[0].Size),
			rowsLoading: true, keepRows: true, keepVersion: 40, rowsFrom: proto.Int64(40)}}}
		if err := c.initMoved(context.Background(), 0, mv, 2); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		if len(f.inits) != fails+1 || f.loads != 0 {
			t.Errorf("%d failed Inits: %d Inits and %d LoadRows; want %d and 0", fails, len(f.inits), f.loads, fails+1)
		}
		for i, req := range f.inits {
			if req.RowsFromCheckpoint == nil || *req.RowsFromCheckpoint != 40 || !req.RowsLoading || !req.KeepRows || req.KeepRowsVersion != 40 {
				t.Errorf("Init %d: rows from the checkpoint of step %v, loading %t, keep %t at %d; want 40, true, true at 40",
					i, req.RowsFromCheckpoint, req.RowsLoading, req.KeepRows, req.KeepRowsVersion)
			}
		}
		f.mu.Unlock()
	}
}

// ctrRun is a valid CTR run of ps parameter servers, the defaults
// otherwise.
func ctrRun(ps int) config.Run {
	r := config.Default()
	r.Model, r.Hidden, r.Dataset, r.PS = "ctr", config.DefaultCTRHidden, "synth-ctr", ps
	r.EmbeddingDim, r.EmbeddingOptimizer, r.EmbeddingLR = config.DefaultEmbeddingDim, config.DefaultEmbeddingOptimizer, config.DefaultEmbeddingLR
	return r
}
