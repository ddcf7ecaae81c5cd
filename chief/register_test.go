package chief

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/proto/convert"
)

func TestRegisterRefusesAndCounts(t *testing.T) {
	r := config.Default()
	spec := r.Spec(784, 10)
	m := metrics.NewChief(prometheus.NewRegistry())
	c, err := New(Config{Run: r, Spec: spec, RunID: "run-1", PS: make([]PS, r.PS), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	other := r
	other.LR = 0.05
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
	}{
		{"other config", func() error {
			_, err := c.Register(ctx, &pb.RegisterRequest{Role: "worker", Index: 0, Settings: convert.Settings(other), ModelSpec: convert.ModelSpec(spec)})
			return err
		}, codes.FailedPrecondition, "config"},
		{"other model", func() error {
			s := model.Spec{Input: 784, Hidden: []int{10}, Classes: 10}
			_, err := c.Register(ctx, &pb.RegisterRequest{Role: "worker", Index: 0, Settings: convert.Settings(r), ModelSpec: convert.ModelSpec(s)})
			return err
		}, codes.FailedPrecondition, "config"},
		{"unknown role", func() error {
			_, err := c.Register(ctx, &pb.RegisterRequest{Role: "gpu", Settings: convert.Settings(r)})
			return err
		}, codes.InvalidArgument, "task"},
		{"index out of range", func() error {
			_, err := c.Register(ctx, &pb.RegisterRequest{Role: "ps", Index: 9, Settings: convert.Settings(r)})
			return err
		}, codes.InvalidArgument, "task"},
		{"heartbeat of another run", func() error {
			_, err := c.Heartbeat(ctx, &pb.HeartbeatRequest{Worker: 0, RunId: "run-0"})
			return err
		}, codes.FailedPrecondition, "run_id"},
	}
	for _, tc := range cases {
		before := testutil.ToFloat64(m.RejectedRequests.WithLabelValues(tc.reason))
		if err := tc.call(); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
		if after := testutil.ToFloat64(m.RejectedRequests.WithLabelValues(tc.reason)); after != before+1 {
			t.Errorf("%s: pstrain_chief_rejected_requests_total{reason=%q} went from %v to %v", tc.name, tc.reason, before, after)
		}
	}
	// A matching task is registered and gets its data shard.
	resp, err := c.Register(ctx, &pb.RegisterRequest{Role: "worker", Index: 1, Settings: convert.Settings(r), ModelSpec: convert.ModelSpec(spec)})
	if err != nil || resp.RunId != "run-1" || resp.DataShard != 1 || resp.NumDataShards != int32(r.Workers) {
		t.Fatalf("a matching worker: %+v, %v", resp, err)
	}
}

// A worker started with --model cnn against an MLP chief is refused, and
// the message names the model kind and the two specs.
func TestRegisterRefusesAnotherModelKind(t *testing.T) {
	r := config.Default()
	c, err := New(Config{Run: r, Spec: r.Spec(784, 10), RunID: "run-1", PS: make([]PS, r.PS), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Metrics: metrics.NewChief(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	cnn := r
	cnn.Model, cnn.Conv, cnn.Hidden = "cnn", config.DefaultCNNConv, config.DefaultCNNHidden
	_, err = c.Register(context.Background(), &pb.RegisterRequest{Role: "worker", Index: 0, Settings: convert.Settings(cnn), ModelSpec: convert.ModelSpec(cnn.Spec(784, 10))})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a CNN worker for an MLP chief: %v", err)
	}
	for _, want := range []string{"model: mlp (chief) vs cnn (this task)", `"kind":"cnn"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
}
