package chief

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/metrics"
)

// A CTR run's PS count may change (its rows move with the layout,
// psscale.go); a rebalance is refused, saying why: weights move the
// dense blocks only, and a row's shard depends on the count alone.
func TestCTRScalesPSButIsNotRebalanced(t *testing.T) {
	r := config.Default()
	r.Model, r.MaxPS = config.ModelKind("ctr"), 3
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
