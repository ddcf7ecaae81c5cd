package metrics

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const fixtureProc = "testdata/proc"

func TestHostCollectorFixture(t *testing.T) {
	c, err := NewHostCollector(fixtureProc)
	if err != nil {
		t.Fatal(err)
	}
	const want = `# HELP pstrain_host_cpu_seconds_total CPU time the host spent in each mode, summed over all CPUs, in seconds.
# TYPE pstrain_host_cpu_seconds_total counter
pstrain_host_cpu_seconds_total{mode="idle"} 5000
pstrain_host_cpu_seconds_total{mode="iowait"} 12
pstrain_host_cpu_seconds_total{mode="irq"} 0
pstrain_host_cpu_seconds_total{mode="nice"} 2
pstrain_host_cpu_seconds_total{mode="softirq"} 3.5
pstrain_host_cpu_seconds_total{mode="steal"} 0.25
pstrain_host_cpu_seconds_total{mode="system"} 100.5
pstrain_host_cpu_seconds_total{mode="user"} 301
# HELP pstrain_host_cpus Number of CPUs of the host, counted from the per-CPU lines of /proc/stat.
# TYPE pstrain_host_cpus gauge
pstrain_host_cpus 2
# HELP pstrain_host_load1 Host load average over the last minute (runnable plus uninterruptible tasks).
# TYPE pstrain_host_load1 gauge
pstrain_host_load1 0.52
# HELP pstrain_host_load15 Host load average over the last 15 minutes.
# TYPE pstrain_host_load15 gauge
pstrain_host_load15 2.5
# HELP pstrain_host_load5 Host load average over the last 5 minutes.
# TYPE pstrain_host_load5 gauge
pstrain_host_load5 1.25
# HELP pstrain_host_memory_available_bytes Memory of the host available for new work without swapping (MemAvailable), in bytes.
# TYPE pstrain_host_memory_available_bytes gauge
pstrain_host_memory_available_bytes 8.388608e+09
# HELP pstrain_host_memory_total_bytes Total usable memory of the host (MemTotal), in bytes.
# TYPE pstrain_host_memory_total_bytes gauge
pstrain_host_memory_total_bytes 1.6777216e+10
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	// Collecting is repeatable: the collector holds no state between scrapes.
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatalf("second collection: %v", err)
	}
}

func TestHostCollectorPassesLint(t *testing.T) {
	c, err := NewHostCollector(fixtureProc)
	if err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// writeProc writes a proc fixture directory holding the given files.
func writeProc(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func readFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureProc, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestHostCollectorWithoutMemAvailable(t *testing.T) {
	dir := writeProc(t, map[string]string{
		"loadavg": readFixture(t, "loadavg"),
		"stat":    readFixture(t, "stat"),
		"meminfo": "MemTotal:       1000 kB\nMemFree:         500 kB\n",
	})
	c, err := NewHostCollector(dir)
	if err != nil {
		t.Fatal(err)
	}
	const want = `# HELP pstrain_host_memory_total_bytes Total usable memory of the host (MemTotal), in bytes.
# TYPE pstrain_host_memory_total_bytes gauge
pstrain_host_memory_total_bytes 1.024e+06
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		MetricHostMemoryTotalBytes, MetricHostMemoryAvailableBytes); err != nil {
		t.Fatal(err)
	}
}

func TestHostCollectorReportsUnreadableFiles(t *testing.T) {
	// Only loadavg present: stat and meminfo fail, load is still collected.
	dir := writeProc(t, map[string]string{"loadavg": readFixture(t, "loadavg")})
	c, err := NewHostCollector(dir)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := Gather(reg)
	if err == nil {
		t.Fatal("Gather succeeded, want errors for the missing stat and meminfo")
	}
	for _, file := range []string{"stat", "meminfo"} {
		if !strings.Contains(err.Error(), "reading "+file) {
			t.Errorf("Gather error %q does not mention %s", err, file)
		}
	}
	if v, ok := fams.Value(MetricHostLoad1, nil); !ok || v != 0.52 {
		t.Errorf("%s = %v, %v; want 0.52, true", MetricHostLoad1, v, ok)
	}
	if fams.Has(MetricHostCPUs) {
		t.Errorf("%s present although stat is missing", MetricHostCPUs)
	}
}

func TestNewHostCollectorBadRoot(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-proc")
	if _, err := NewHostCollector(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("NewHostCollector(%q) error = %v, want one naming the path", missing, err)
	}
}
