package ps

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
	"github.com/pstrain/pstrain/transport/wire"
)

// TestPullRowsNowAnswersWhatPullRowsWould: a sync row pull of a version
// the tables are not at is not ready, and nothing is done or counted;
// one of the version they are at is PullRows's answer, counted once,
// its rows written into the memory lent for them.
func TestPullRowsNowAnswersWhatPullRowsWould(t *testing.T) {
	r := config.Default()
	r.Mode, r.Workers, r.PS, r.LRSchedule = config.Sync, 1, 1, "constant"
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, err := partition.New(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	table := embed.TableConfig{Name: "emb/C1", Dim: 2, Seed: 1, Rule: embed.Rule{Kind: embed.SGD, LR: 1}}
	m := metrics.NewPS(nil)
	srv := NewServer(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: m, Shard: AnyShard})
	ctx := context.Background()
	if _, err := srv.Init(ctx, &pb.InitRequest{RunId: "r", NumShards: 1, ShardOptions: OptionsFor(r).Proto(), Generation: 1,
		Params: wire.Bytes(make([]float32, plan.Shards[0].Size)), ModelSpec: convert.ModelSpec(spec),
		Tables: TableSpecs([]embed.TableConfig{table})}); err != nil {
		t.Fatal(err)
	}
	pulls := func() float64 { return testutil.ToFloat64(m.Requests.WithLabelValues("pull_rows")) }
	req := func(v int64) *pb.PullRowsRequest {
		return &pb.PullRowsRequest{RunId: "r", Worker: 0, Generation: 1, MinVersion: v, Tables: []*pb.RowBlock{{Table: table.Name, Keys: []uint64{3, 9}}}}
	}
	if resp, ready, err := srv.PullRowsNow(req(1), nil); ready || resp != nil || err != nil || pulls() != 0 {
		t.Fatalf("a pull of version 1 at version 0: %v, ready %t, %v; %v pulls counted", resp, ready, err, pulls())
	}
	if rows := rowsOf(srv, table.Name); len(rows) != 0 {
		t.Fatalf("a pull not ready created rows: %v", rows)
	}
	lent := make([]float32, 8)
	asked := 0
	now, ready, err := srv.PullRowsNow(req(0), func(n int) []float32 { asked = n; return lent[:n] })
	if !ready || err != nil || pulls() != 1 {
		t.Fatalf("a pull of version 0 at version 0: ready %t, %v; %v pulls counted", ready, err, pulls())
	}
	waited, err := srv.PullRows(ctx, req(0))
	if err != nil || !proto.Equal(now, waited) || len(now.Tables[0].Values) != 2*2*4 {
		t.Fatalf("PullRowsNow answered %v, PullRows %v (%v)", now, waited, err)
	}
	if v, _ := wire.Floats(now.Tables[0].Values); asked != 4 || &v[0] != &lent[0] {
		t.Fatalf("the answer's rows are not in the memory lent for them (%d values asked for)", asked)
	}
	if _, ready, err := srv.PullRowsNow(&pb.PullRowsRequest{RunId: "another"}, nil); !ready || err == nil {
		t.Fatalf("a pull of another run: ready %t, %v; want its refusal", ready, err)
	}
}
