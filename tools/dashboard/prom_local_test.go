// Self-contained integration test: a real Prometheus scraping a real
// `pstrain run`, and every panel query of the dashboard evaluated against it.
//
// TestDashboardAgainstLocalRun needs the prometheus binary on PATH (Debian's
// package; scripts/setup.sh installs it) and MNIST in ../data (or
// $PSTRAIN_DATA_DIR). Without them it is skipped, except under CI=true,
// where it fails. It runs in about a minute: it builds bin/pstrain into a
// temporary directory, starts a default sync cluster (2 PS, 2 workers) that
// trains for longer than the test lasts (--target-accuracy 0), starts
// Prometheus on a free loopback port scraping the run's file_sd targets every
// second, waits until every task is up and the workers' step rate shows in
// Prometheus, evaluates every panel query, then stops both.
//
// The queries use $__rate_interval=5s instead of Grafana's 8s minimum for a
// 2s scrape interval (see DefaultVariables): at a 1s scrape interval, 5s
// holds five samples, and the test need not wait as long for data.

package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/syncbuf"
	"github.com/pstrain/pstrain/internal/testbin"
)

// localAllowEmpty lists the queries that may return no series in the local
// run, which writes checkpoints every 2 s and kills worker/1 once the
// first is committed (in training, on a busy machine too: a kill before
// the worker registered would count no restart) so that the checkpoint
// and restart panels have data:
//
//   - "RPC retries and rejections#B": pstrain_ps_rejected_requests_total has
//     a series only after a PS refused a request (e.g. a push from a worker
//     of an older run, or a malformed gradient); a healthy run has none, even
//     with faults, so this entry stays.
//   - "Requests refused by reason" and "Gradients refused by worker and
//     reason": the same holds for the PS's and the chief's refusals and for
//     the gradients the divergence guard refuses.
//   - "Connections closed by plane and reason": a PS counts only the
//     connections it refuses or cuts (over the limit, failed TLS, idle,
//     slow). Whether killing worker/1 leaves one to cut within the test
//     depends on timing (in a run on 2 busy cores it did: one series).
//   - "PS process roles": pstrain_ps_replica_role has a series once a PS
//     process has a replica role (the ps side of hot standbys sets it); and
//     "Failovers and replicated bytes#A": pstrain_failovers_total only
//     after the chief promoted a standby. The local run has no
//     --ps-replicas and no PS fault.
var localAllowEmpty = []string{
	"PS process roles",
	"Failovers and replicated bytes#A",
	"RPC retries and rejections#B",
	"Requests refused by reason",
	"Connections closed by plane and reason",
	"Gradients refused by worker and reason",
}

// Timing of the local run.
const (
	localRateInterval = "5s"
	localScrape       = "1s"
	// localWarmup is how long after the first successful step-rate query the
	// test waits before evaluating, so that every rate window is full.
	localWarmup = 6 * time.Second
	// localReadyTimeout bounds the wait for the cluster and Prometheus.
	localReadyTimeout = 60 * time.Second
	// localQueryWait bounds the retries of queries that are still empty.
	localQueryWait = 15 * time.Second
)

// needOrSkip skips the test (or fails it under CI=true) with msg.
func TestDashboardAgainstLocalRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a training run and Prometheus; skipped with -short")
	}
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		testbin.NeedOrSkip(t, "prometheus is not on PATH (apt-get install prometheus, or run scripts/setup.sh)")
	}
	dataDir := testbin.MNIST(t)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var pstrain testbin.Binary
	defer pstrain.Remove()
	bin := pstrain.Path(t)

	runDir := filepath.Join(dir, "run")
	sdDir := filepath.Join(runDir, "targets")
	if err := os.MkdirAll(sdDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var runOut syncbuf.Buffer
	run := startGroup(t, &runOut, bin, "run", "--epochs", "100", "--target-accuracy", "0",
		"--data-dir", dataDir, "--run-dir", runDir, "--sd-dir", sdDir,
		"--checkpoint-every", "2s", "--fault", "worker/1@checkpoint:1")

	promPort := freePort(t)
	promURL := "http://127.0.0.1:" + strconv.Itoa(promPort)
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(promConfig(sdDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	var promOut syncbuf.Buffer
	startGroup(t, &promOut, promBin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(promPort), "--log.level=warn")

	// Ready: all five tasks up in Prometheus, and the workers' step rate
	// visible over a whole rate window.
	client := &http.Client{Timeout: 5 * time.Second}
	ready := `count(up{job="pstrain"} == 1) == 5 and on() sum(rate(pstrain_worker_steps_total{job="pstrain"}[` + localRateInterval + `])) > 0`
	deadline := time.Now().Add(localReadyTimeout)
	for {
		if run.exited() {
			t.Fatalf("pstrain run exited early:\n%s", runOut.String())
		}
		r, err := promQuery(ctx, client, promURL, ready, "")
		if err == nil {
			if n, _ := r.series(); n > 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster not scraped after %s (last error: %v)\n--- pstrain run ---\n%s\n--- prometheus ---\n%s\n--- targets ---\n%s",
				localReadyTimeout, err, runOut.String(), promOut.String(), targetsState(ctx, client, promURL))
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	select {
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	case <-time.After(localWarmup):
	}
	if run.exited() {
		t.Fatalf("pstrain run exited before the queries:\n%s", runOut.String())
	}

	vars := DefaultVariables()
	vars["__rate_interval"] = localRateInterval
	queries, err := PanelQueriesWith(dashboardPath, vars)
	if err != nil {
		t.Fatal(err)
	}
	evalPanelQueries(t, promURL, queries, "", localQueryWait, localAllowEmpty, "localAllowEmpty in prom_local_test.go")
	if t.Failed() {
		t.Logf("--- pstrain run ---\n%s\n--- targets ---\n%s", runOut.String(), targetsState(ctx, client, promURL))
	}
}

// promConfig is the test's Prometheus configuration: job pstrain, scraping
// the file_sd targets in sdDir every second.
func promConfig(sdDir string) string {
	return fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
scrape_configs:
  - job_name: pstrain
    file_sd_configs:
      - files: [%[2]q]
        refresh_interval: 1s
`, localScrape, filepath.Join(sdDir, "*.json"))
}

// targetsState returns Prometheus' view of its targets, for failure messages.
func targetsState(ctx context.Context, client *http.Client, base string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/targets", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := client.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			ActiveTargets []struct {
				ScrapeURL string            `json:"scrapeUrl"`
				Labels    map[string]string `json:"labels"`
				Health    string            `json:"health"`
				LastError string            `json:"lastError"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, a := range body.Data.ActiveTargets {
		fmt.Fprintf(&b, "%s %s %s %s\n", a.Labels["task"], a.ScrapeURL, a.Health, a.LastError)
	}
	return b.String()
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// group is a process started in its own process group.
type group struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (g *group) exited() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

// startGroup starts name args in a new process group with output to out
// At cleanup it sends SIGTERM to the process, waits up to 15s (pstrain run
// stops its children on SIGTERM), then kills the whole group.
func startGroup(t *testing.T, out *syncbuf.Buffer, name string, args ...string) *group {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	g := &group{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(g.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-g.done:
		case <-time.After(15 * time.Second):
			t.Logf("%s did not stop on SIGTERM; killing its process group", name)
		}
		// Whatever is left of the group (children of pstrain run included).
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-g.done
	})
	return g
}
