package metrics

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestConstructorsOnTwoRegistries checks that every constructor can run twice
// in one process, once per registry, as when several shards share a test.
func TestConstructorsOnTwoRegistries(t *testing.T) {
	for i := range 2 {
		_ = NewRegistry("test")
		NewWorker(prometheus.NewPedanticRegistry())
		NewPS(prometheus.NewPedanticRegistry())
		NewChief(prometheus.NewPedanticRegistry())

		// A role on top of NewRegistry, as a real process does.
		reg := NewRegistry("test")
		NewPS(reg)
		if _, err := reg.Gather(); err != nil {
			t.Fatalf("round %d: gather: %v", i, err)
		}
	}
}

func TestConstructorsNilRegisterer(t *testing.T) {
	w := NewWorker(nil)
	w.Steps.Inc()
	if got := testutil.ToFloat64(w.Steps); got != 1 {
		t.Fatalf("steps = %v, want 1", got)
	}
	NewPS(nil).GlobalStep.Set(3)
	NewChief(nil).LiveWorkers.Set(2)
}

func TestSameRegistryTwicePanics(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewWorker(reg)
	defer func() {
		if recover() == nil {
			t.Fatal("second NewWorker on the same registry did not panic")
		}
	}()
	NewWorker(reg)
}

func TestPSAndChiefConflictOnGlobalStep(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewPS(reg)
	defer func() {
		if recover() == nil {
			t.Fatal("NewChief on a PS registry did not panic")
		}
	}()
	NewChief(reg)
}

func TestWorkerPhasesExistFromStart(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	w := NewWorker(reg)
	fams, err := Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Phases() {
		h, ok := fams.Histogram(MetricWorkerStepPhase, map[string]string{LabelPhase: p})
		if !ok || h.Count != 0 {
			t.Errorf("phase %q: histogram %+v, %v; want an empty series", p, h, ok)
		}
	}

	w.ObservePhase(PhaseCompute, 3*time.Millisecond)
	fams, err = Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	h, ok := fams.Histogram(MetricWorkerStepPhase, map[string]string{LabelPhase: PhaseCompute})
	if !ok || h.Count != 1 || h.Sum != 0.003 {
		t.Fatalf("compute phase = %+v, %v; want one 3ms observation", h, ok)
	}
}

func TestRoleMetricsPassLint(t *testing.T) {
	for name, register := range map[string]func(prometheus.Registerer){
		"worker": func(r prometheus.Registerer) { NewWorker(r) },
		"ps":     func(r prometheus.Registerer) { NewPS(r) },
		"chief":  func(r prometheus.Registerer) { NewChief(r) },
	} {
		reg := prometheus.NewPedanticRegistry()
		register(reg)
		problems, err := testutil.GatherAndLint(reg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range problems {
			t.Errorf("%s: lint: %s: %s", name, p.Metric, p.Text)
		}
	}
}

func TestBuckets(t *testing.T) {
	lat := LatencyBuckets()
	if lat[0] != 0.0001 || lat[len(lat)-1] < 10 || lat[len(lat)-1] > 20 {
		t.Errorf("LatencyBuckets = %v, want 100µs up to ~10s", lat)
	}
	want := []float64{0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64}
	got := StalenessBuckets()
	if len(got) != len(want) {
		t.Fatalf("StalenessBuckets = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("StalenessBuckets = %v, want %v", got, want)
		}
	}
}

func TestBuildInfo(t *testing.T) {
	reg := NewRegistry("v1.2.3")
	fams, err := Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := fams.Value(MetricBuildInfo, map[string]string{LabelVersion: "v1.2.3"}); !ok || v != 1 {
		t.Errorf("build info = %v, %v; want 1", v, ok)
	}
	s := fams.Series(MetricBuildInfo, nil)
	if len(s) != 1 || s[0].Labels[LabelGoVersion] == "" || s[0].Labels[LabelRevision] == "" {
		t.Errorf("build info series = %+v, want one with a goversion and a revision", s)
	}
	want := []string{"go_goroutines"}
	if runtime.GOOS == "linux" {
		want = append(want, "process_cpu_seconds_total", MetricHostCPUs)
	}
	for _, name := range want {
		if !fams.Has(name) {
			t.Errorf("NewRegistry lacks %s", name)
		}
	}

	fams, err = Gather(NewRegistry(""))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fams.Value(MetricBuildInfo, map[string]string{LabelVersion: "unknown"}); !ok {
		t.Error(`empty version not reported as "unknown"`)
	}
}

func TestRevision(t *testing.T) {
	stamped := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0e94e06abc"}, {Key: "vcs.modified", Value: "true"}}}
	for _, c := range []struct {
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{stamped, true, "0e94e06abc"},
		{&debug.BuildInfo{}, true, "unknown"}, // built with -buildvcs=false, or a test binary
		{nil, false, "unknown"},               // no build information at all
	} {
		if got := revision(c.info, c.ok); got != c.want {
			t.Errorf("revision(%+v, %v) = %q, want %q", c.info, c.ok, got, c.want)
		}
	}
	fams, err := Gather(NewRegistry("v1"))
	if err != nil {
		t.Fatal(err)
	}
	if s := fams.Series(MetricBuildInfo, nil); len(s) != 1 || s[0].Labels[LabelRevision] != revision(debug.ReadBuildInfo()) {
		t.Errorf("build info %+v, want revision %q", s, revision(debug.ReadBuildInfo()))
	}
}

// The host's metrics only where asked for: one task per host exports them.
func TestRegistryWithoutHost(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the host collector reads /proc")
	}
	for _, host := range []bool{true, false} {
		fams, err := Gather(NewRegistryWith(RegistryOptions{Version: "v1", Host: host}))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{MetricHostLoad1, MetricHostCPUs, MetricHostCPUSeconds, MetricHostMemoryTotalBytes} {
			if fams.Has(name) != host {
				t.Errorf("Host %v: has %s = %v", host, name, fams.Has(name))
			}
		}
		if !fams.Has(MetricBuildInfo) || !fams.Has("process_cpu_seconds_total") {
			t.Errorf("Host %v: no build info or process metrics", host)
		}
	}
}

// Async SGD has no barrier: the PS leaves the barrier histogram out (and
// still accepts observations).
func TestPSWithoutBarrier(t *testing.T) {
	for _, noBarrier := range []bool{false, true} {
		reg := prometheus.NewPedanticRegistry()
		p := NewPSWith(reg, PSOptions{NoBarrier: noBarrier})
		p.BarrierWait.Observe(0.01)
		p.Requests.WithLabelValues("pull").Inc()
		fams, err := Gather(reg)
		if err != nil {
			t.Fatal(err)
		}
		if fams.Has(MetricSyncBarrierWait) == noBarrier || !fams.Has(MetricPSRequests) {
			t.Errorf("NoBarrier %v: has %s = %v, has %s = %v", noBarrier, MetricSyncBarrierWait, fams.Has(MetricSyncBarrierWait), MetricPSRequests, fams.Has(MetricPSRequests))
		}
	}
}

// The restart counter's label is restarted_task, not the target label task.
func TestTaskRestartsLabel(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	NewChief(reg).TaskRestarts.WithLabelValues("ps/1").Inc()
	fams, err := Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	s := fams.Series(MetricTaskRestarts, nil)
	if len(s) != 1 || s[0].Labels[LabelRestartedTask] != "ps/1" || s[0].Labels[LabelTask] != "" {
		t.Errorf("%s series %+v, want one with restarted_task=ps/1 and no task label", MetricTaskRestarts, s)
	}
}
