package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/transport/auth"
)

// pushHeader is the header of a data-plane push (docs/wire.md: "PSD3",
// op 2, no flags, no run id, worker, version, generation, loss, data
// position, payload length, then the credential; little-endian)
// announcing n payload bytes, signed as worker/0 with keys: a client
// holding the run's token (an outsider's frame is refused before its
// size is even looked at: security_test.go), so that the limits are
// what refuses it.
func pushHeader(keys *auth.Keyring, n uint32) []byte {
	b := append([]byte("PSD3"), 2, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, 0) // worker
	b = binary.LittleEndian.AppendUint64(b, 0) // version
	b = binary.LittleEndian.AppendUint64(b, 0) // generation
	b = binary.LittleEndian.AppendUint32(b, 0) // loss
	b = binary.LittleEndian.AppendUint64(b, 0) // data position
	b = binary.LittleEndian.AppendUint32(b, n)
	id := auth.Identity{Role: auth.RoleWorker, Index: 0, Session: 1}
	b = append(b, byte(auth.RoleCode(id.Role)))
	b = binary.LittleEndian.AppendUint32(b, uint32(id.Index))
	b = binary.LittleEndian.AppendUint64(b, id.Session)
	return append(b, keys.FrameMAC(id, b)...)
}

// procStatusMiB reads a field of /proc/PID/status (VmRSS, VmHWM) in MiB.
func procStatusMiB(t *testing.T, pid int, field string) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the PS's status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", field, line, err)
			}
			return kb / 1024
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// rssSampler records the highest VmRSS of a process until stopped.
type rssSampler struct {
	peak atomic.Uint64 // KiB
	stop chan struct{}
	done chan struct{}
}

func sampleRSS(t *testing.T, pid int) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
						kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
						if kb > s.peak.Load() {
							s.peak.Store(kb)
						}
					}
				}
			}
			select {
			case <-tick.C:
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

// peakMiB stops the sampler and returns the highest RSS seen.
func (s *rssSampler) peakMiB() float64 {
	close(s.stop)
	<-s.done
	return float64(s.peak.Load()) / 1024
}

// TestHostileConnectionsLeaveThePSBounded (bounded resources per PS,
// docs/security.md "Limits"): while a real cluster trains, 4 raw connections each announce
// a legal-looking 256 MiB push to the PS's data plane and try to send and
// hold it for 15 s; then 10 more connections stay silent, past
// --max-connections 8. Before the limits, the first four took the PS
// from about 40 MiB to 1.1 GiB, for good. Now: the pushes are refused
// after their header (256 MiB is more than the shard's gradient), the
// connections past the limit are closed at once and the silent ones
// after --idle-timeout, all counted in the PS's metrics; the PS's RSS
// stays below 200 MiB throughout and training goes on.
func TestHostileConnectionsLeaveThePSBounded(t *testing.T) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	a := freeAddrs(t, 5)
	dataAddr, metricsAddr := a[3], a[4]
	cf := filepath.Join(tmp, "cluster.json")
	os.WriteFile(cf, []byte(fmt.Sprintf(`{"chief":["%s"],"ps":["%s"],"worker":["%s"]}`, a[0], a[1], a[2])), 0o644)
	rp := filepath.Join(tmp, "report.json")
	// A long run, stopped with Ctrl-C below; evaluations only at the end,
	// so that the worker holds the only connections to the data plane
	// meanwhile: two, its pushes' and its pulls' (worker.Shard.Puller).
	token := tokenFile(t)
	tok, err := auth.ReadTokenFile(token)
	if err != nil {
		t.Fatal(err)
	}
	keys := auth.NewKeyring(tok)
	common := []string{"--cluster", cf, "--ps", "1", "--workers", "1", "--data-dir", d, "--epochs", "1000",
		"--target-accuracy", "0", "--eval-every", "0", "--connect-timeout", "30s", "--auth-token-file", token}
	chief := startTask(t, nil, append([]string{"chief", "--metrics-addr", "off", "--report", rp}, common...)...)
	ps := startTask(t, nil, append([]string{"ps", "--index", "0", "--data-addr", dataAddr, "--metrics-addr", metricsAddr,
		"--max-connections", "8", "--idle-timeout", "3s"}, common...)...)
	worker := startTask(t, nil, append([]string{"worker", "--index", "0", "--metrics-addr", "off"}, common...)...)
	pid := ps.cmd.Process.Pid

	ctx := context.Background()
	scrape := func() metrics.Families {
		t.Helper()
		f, err := metrics.Scrape(ctx, "http://"+metricsAddr+metrics.MetricsPath)
		if err != nil {
			t.Fatalf("scraping the PS: %v", err)
		}
		return f
	}
	// waitMetric waits until the PS's metric (summed over the labels
	// given) satisfies ok.
	waitMetric := func(name string, labels map[string]string, ok func(float64) bool, within time.Duration) float64 {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			if f, err := metrics.Scrape(ctx, "http://"+metricsAddr+metrics.MetricsPath); err == nil {
				if v := f.Sum(name, labels); ok(v) {
					return v
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s%v never as expected within %v; PS output:\n%s", name, labels, within, ps.out.String())
			}
			time.Sleep(50 * time.Millisecond) // polling a condition, with a deadline
		}
	}
	stepBefore := waitMetric(metrics.MetricGlobalStep, nil, func(v float64) bool { return v > 0 }, 2*time.Minute)
	rssBefore := procStatusMiB(t, pid, "VmRSS")
	sampler := sampleRSS(t, pid)

	// 1. Four connections, each announcing 256 MiB and sending it.
	const announced, hold = 256 << 20, 15 * time.Second
	type outcome struct {
		sent   int
		closed bool // by the server, before the hold ended
		took   time.Duration
	}
	results := make([]outcome, 4)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			c, err := net.Dial("tcp", dataAddr)
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			defer c.Close()
			c.SetDeadline(t0.Add(hold))
			chunk := make([]byte, 1<<20)
			sent := 0
			_, err = c.Write(pushHeader(keys, announced))
			for err == nil && sent < announced {
				var n int
				n, err = c.Write(chunk)
				sent += n
			}
			if err == nil {
				// All sent: hold the connection, as a client waiting for
				// its answer.
				_, err = io.Copy(io.Discard, c)
			}
			var ne net.Error
			timedOut := errors.As(err, &ne) && ne.Timeout()
			results[i] = outcome{sent: sent, closed: !timedOut, took: time.Since(t0)}
		}()
	}
	wg.Wait()
	for i, r := range results {
		if !r.closed || r.sent >= announced {
			t.Errorf("256 MiB push %d: sent %d MiB in %v, closed by the PS: %v; want it refused before its payload", i, r.sent>>20, r.took, r.closed)
		}
	}
	waitMetric(metrics.MetricPSRejectedRequests, map[string]string{metrics.LabelReason: "too_large"}, func(v float64) bool { return v == 4 }, 30*time.Second)

	// 2. Ten silent connections, past --max-connections 8 with the
	// worker's two. Wait until the PS has let go of the first four.
	waitMetric(metrics.MetricPSDataPlaneConnections, nil, func(v float64) bool { return v == 2 }, 30*time.Second)
	closedAfter := make([]time.Duration, 10)
	for i := range closedAfter {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			c, err := net.Dial("tcp", dataAddr)
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			defer c.Close()
			c.SetReadDeadline(t0.Add(time.Minute))
			_, err = c.Read(make([]byte, 1))
			if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("silent connection %d: %v, want it closed by the PS", i, err)
			}
			closedAfter[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	t.Logf("silent connections closed after %v", closedAfter)
	closed := scrape()
	limit := closed.Sum(metrics.MetricPSConnectionsClosed, map[string]string{metrics.LabelPlane: "data", metrics.LabelReason: "limit"})
	idle := closed.Sum(metrics.MetricPSConnectionsClosed, map[string]string{metrics.LabelPlane: "data", metrics.LabelReason: "idle"})
	if limit != 4 || idle < 6 {
		t.Errorf("connections closed: %v over the limit (want 4), %v idle (want 6)", limit, idle)
	}

	// Training went on meanwhile, and the PS stayed small.
	stepAfter := waitMetric(metrics.MetricGlobalStep, nil, func(v float64) bool { return v > stepBefore }, time.Minute)
	peak, hwm := sampler.peakMiB(), procStatusMiB(t, pid, "VmHWM")
	t.Logf("PS RSS %.1f MiB before, peak %.1f MiB during (VmHWM %.1f MiB); global step %v -> %v", rssBefore, peak, hwm, stepBefore, stepAfter)
	if peak >= 200 || hwm >= 200 {
		t.Errorf("PS RSS peaked at %.1f MiB (VmHWM %.1f MiB), want < 200 MiB", peak, hwm)
	}

	// A clean stop: Ctrl-C to the chief, which stops the others.
	if err := chief.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*proc{"chief": chief, "ps": ps, "worker": worker} {
		err := p.wait(t, 2*time.Minute)
		var exit interface{ ExitCode() int }
		if name == "chief" && errors.As(err, &exit) && exit.ExitCode() == 130 {
			continue
		}
		if err != nil {
			t.Errorf("%s: %v\n%s", name, err, p.out.String())
		}
	}
	rep, err := report.Read(rp)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StoppedBy != "interrupted" || float64(rep.GlobalSteps) < stepAfter {
		t.Errorf("report: stopped by %s after %d steps; want interrupted after >= %v", rep.StoppedBy, rep.GlobalSteps, stepAfter)
	}
}
