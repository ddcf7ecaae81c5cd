package bench

import (
	"context"
	"testing"
	"time"

	"github.com/pstrain/pstrain/ml/model"
)

// TestMetricsOverheadScrapesEveryOnRound gives each round far less time
// than one scrape takes: every "on" round must still have had a whole
// tick of scrapes (both processes) finish in it.
func TestMetricsOverheadScrapesEveryOnRound(t *testing.T) {
	if testing.Short() {
		t.Skip("starts gRPC servers")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := model.Spec{Input: 64, Hidden: []int{32}, Classes: 10}
	const rounds = 3
	m, err := MetricsOverhead(ctx, OverheadConfig{Spec: spec, Batch: 16, Budget: 200 * time.Microsecond, Rounds: rounds, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if m.Scrapes < 2*rounds || m.ScrapeMillisecondsMean <= 0 || m.OnSamplesPerSecond <= 0 || m.OffSamplesPerSecond <= 0 {
		t.Fatalf("metrics_overhead = %+v, want at least %d scrapes", m, 2*rounds)
	}
}
