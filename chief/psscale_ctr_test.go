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

	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/rowclient"
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

// rowsPS is a PS process as a CTR move sees it: Init, then LoadRows;
// the first failLoads loads fail as a killed process's would, and the
// process comes back empty (its rows lost, waiting for an Init).
type rowsPS struct {
	pb.ParameterServerClient
	mu        sync.Mutex
	failLoads int
	keeps     int // the first keeps Inits answer that the shard kept its rows
	inits     int
	rows      int  // rows loaded since the last Init
	released  bool // the load's Done came after the last Init
}

func (f *rowsPS) Init(context.Context, *pb.InitRequest, ...grpc.CallOption) (*pb.InitResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inits, f.rows, f.released = f.inits+1, 0, false
	return &pb.InitResponse{RowsKept: f.inits <= f.keeps}, nil
}

func (f *rowsPS) LoadRows(_ context.Context, req *pb.LoadRowsRequest, _ ...grpc.CallOption) (*pb.LoadRowsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failLoads > 0 {
		f.failLoads--
		f.rows, f.released = 0, false
		return nil, errRefused
	}
	f.rows += len(req.Keys)
	f.released = f.released || req.Done
	return &pb.LoadRowsResponse{}, nil
}

// A shard whose process dies while the move loads its rows is
// initialised again once it answers, and its rows loaded again: the
// Init and the load are one attempt of the Init's retries. A shard that
// kept its rows is loaded only those arriving; back empty, all of them.
func TestMovedShardDyingDuringItsLoadIsInitialisedAgain(t *testing.T) {
	for _, keeps := range []int{0, 1} {
		r := ctrRun(1)
		spec := r.CTRSpec(13, 4)
		f := &rowsPS{failLoads: 1, keeps: keeps}
		c, err := New(Config{Run: r, Spec: spec, RunID: "run-1", PS: []PS{{Addr: "ps0:1", Client: f}},
			Metrics: metrics.NewChief(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		// 2 -> 1 shard: the rows of old shard 0 stay, those of shard 1
		// arrive.
		table := func(keys ...uint64) shardckpt.TableRows {
			return shardckpt.TableRows{Name: "emb/C1", Kind: embed.Adagrad, Dim: 2, StateLen: 2,
				Keys: keys, Values: make([]float32, 2*len(keys)), State: make([]float32, 2*len(keys))}
		}
		parts := [][]shardckpt.TableRows{{table(1, 3, 5)}, {table(2, 4)}}
		arriving := rowclient.SplitArriving(parts, 1)
		mv := &move{shards: []shardInit{{params: make([]float32, c.plan.Shards[0].Size), rowsLoading: true, keepRows: true}},
			layout: partition.Layout{PS: 1}, before: 2, parts: parts, arriving: arriving}
		if err := c.initMoved(context.Background(), 0, mv, 2); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		if f.inits != 2 || f.rows != 5 || !f.released {
			t.Errorf("kept %d times: after a load that failed once, %d Inits, %d rows loaded since the last, released %t; want 2, 5, true",
				keeps, f.inits, f.rows, f.released)
		}
		f.mu.Unlock()
	}
	// Kept: only the rows arriving.
	f := &rowsPS{keeps: 1}
	r := ctrRun(1)
	c, err := New(Config{Run: r, Spec: r.CTRSpec(13, 4), RunID: "run-1", PS: []PS{{Addr: "ps0:1", Client: f}},
		Metrics: metrics.NewChief(prometheus.NewRegistry()), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	parts := [][]shardckpt.TableRows{{{Name: "emb/C1", Kind: embed.SGD, Dim: 1, Keys: []uint64{1, 3, 5}, Values: make([]float32, 3)}},
		{{Name: "emb/C1", Kind: embed.SGD, Dim: 1, Keys: []uint64{2, 4}, Values: make([]float32, 2)}}}
	arriving := rowclient.SplitArriving(parts, 1)
	mv := &move{shards: []shardInit{{params: make([]float32, c.plan.Shards[0].Size), rowsLoading: true, keepRows: true}},
		layout: partition.Layout{PS: 1}, before: 2, parts: parts, arriving: arriving}
	if err := c.initMoved(context.Background(), 0, mv, 2); err != nil {
		t.Fatal(err)
	}
	if f.inits != 1 || f.rows != 2 || !f.released {
		t.Errorf("a shard that kept its rows: %d Inits, %d rows loaded, released %t; want 1, 2 (those arriving), true", f.inits, f.rows, f.released)
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
