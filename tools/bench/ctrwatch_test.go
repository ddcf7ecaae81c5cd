package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serveMetrics serves body as a task's /metrics; it returns the
// address.
func serveMetrics(t *testing.T, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func psMetrics(rows, pullKeys, pushKeys int) string {
	return fmt.Sprintf(`# TYPE pstrain_ps_table_rows gauge
pstrain_ps_table_rows{table="emb/C1"} %d
pstrain_ps_table_rows{table="emb/C2"} 1
# TYPE pstrain_ps_table_bytes gauge
pstrain_ps_table_bytes{table="emb/C1"} 1000
# TYPE pstrain_ps_table_row_requests_total counter
pstrain_ps_table_row_requests_total{table="emb/C1",op="pull"} %d
pstrain_ps_table_row_requests_total{table="emb/C1",op="push"} %d
# TYPE pstrain_rpc_sent_bytes_total counter
pstrain_rpc_sent_bytes_total{op="pull_rows"} 100
pstrain_rpc_sent_bytes_total{op="pull"} 10
# TYPE pstrain_rpc_received_bytes_total counter
pstrain_rpc_received_bytes_total{op="pull_rows"} 20
pstrain_rpc_received_bytes_total{op="push_rows"} 300
pstrain_rpc_received_bytes_total{op="push"} 30
pstrain_rpc_received_bytes_total{op="init"} 5000
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 2.5
`, rows, pullKeys, pushKeys)
}

const workerMetrics = `# TYPE pstrain_worker_steps_total counter
pstrain_worker_steps_total 7
# TYPE pstrain_worker_samples_total counter
pstrain_worker_samples_total 896
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
`

// TestScraperReadsEveryTask: the scraper finds the tasks in the
// launcher's target file and reads each PS's table and byte counters
// (the dense and row RPCs' payloads, not the Init's) and the workers'
// steps, samples and CPU.
func TestScraperReadsEveryTask(t *testing.T) {
	dir := t.TempDir()
	tasks := map[string]string{"ps/0": serveMetrics(t, psMetrics(10, 40, 30)), "ps/1": serveMetrics(t, psMetrics(20, 60, 50)),
		"worker/0": serveMetrics(t, workerMetrics), "worker/1": serveMetrics(t, workerMetrics), "chief": "127.0.0.1:1"}
	var groups []target
	for name, addr := range tasks {
		groups = append(groups, target{Targets: []string{addr}, Labels: map[string]string{"task": name, "role": strings.Split(name, "/")[0]}})
	}
	b, _ := json.Marshal(groups)
	if err := os.MkdirAll(filepath.Join(dir, "targets"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "targets", "pstrain.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Scraper{PS: 2, Workers: 2, Interval: 5 * time.Millisecond, Now: time.Now}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Watch(ctx, dir)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Snapshots()) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling the condition: a scrape takes an HTTP round trip
	}
	cancel()
	<-done
	snaps := s.Snapshots()
	if len(snaps) < 2 {
		t.Fatalf("%d snapshots in 10 s", len(snaps))
	}
	got := snaps[0]
	want := Snapshot{At: got.At, WorkerSteps: 14, WorkerSamples: 1792, WorkerCPUSeconds: 3, Shards: []ShardReading{
		{Rows: 11, TableBytes: 1000, PullKeys: 40, PushKeys: 30, RowBytes: 420, DenseBytes: 40, CPUSeconds: 2.5},
		{Rows: 21, TableBytes: 1000, PullKeys: 60, PushKeys: 50, RowBytes: 420, DenseBytes: 40, CPUSeconds: 2.5}}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("snapshot %+v\nwant     %+v", got, want)
	}
}
