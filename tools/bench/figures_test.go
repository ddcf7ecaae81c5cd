package bench

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/report"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestComputeFigures(t *testing.T) {
	got := computeFigures(128, 1e9, 10, 20)
	if got.SamplesPerSecond != 1280 || got.GFLOPS != 10 || got.CeilingSamplesPerSecond != 2560 ||
		got.CeilingGFLOPS != 20 || got.FractionOfCeiling != 0.5 {
		t.Fatalf("computeFigures = %+v", got)
	}
	if z := computeFigures(128, 1e9, 10, 0); z.FractionOfCeiling != 0 {
		t.Fatalf("no ceiling gives fraction %v, want 0", z.FractionOfCeiling)
	}
}

func TestWireFigures(t *testing.T) {
	// 100 round trips/s of 1 MB each way = 200 MB/s; TCP echo at 1 GB/s
	// moves the 2 MB round trip in 2 ms.
	got := wireFigures(1_000_000, 100, 1e9, 250*time.Microsecond)
	if !near(got.MBPerSecond, 200) || !near(got.TCPMBPerSecond, 1000) || !near(got.FractionOfTCP, 0.2) ||
		!near(got.MsPerRoundTrip, 10) || !near(got.TCPMsPerRoundTrip, 2) || !near(got.UpdateMs, 0.25) {
		t.Fatalf("wireFigures = %+v", got)
	}
}

func TestOverheadFigures(t *testing.T) {
	got := overheadFigures(128, "sync", 20, psRound{steps: 10, total: time.Second, compute: 600 * time.Millisecond})
	if !near(got.InProcessSamplesPerSecond, 2560) || !near(got.PSSamplesPerSecond, 1280) || !near(got.Ratio, 0.5) ||
		!near(got.PSMsPerStep, 100) || !near(got.PSComputeMsPerStep, 60) || !near(got.PSCommunicationMsPerStep, 40) ||
		!near(got.InProcessMsPerStep, 50) {
		t.Fatalf("overheadFigures = %+v", got)
	}
}

// fakeClock advances by step on every reading.
type fakeClock struct {
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time { c.t = c.t.Add(c.step); return c.t }

func TestLoopStopsAtBudgetAndMinimum(t *testing.T) {
	c := &fakeClock{t: time.Unix(0, 0), step: 10 * time.Millisecond}
	calls := 0
	n, d, err := loop(context.Background(), c.now, 45*time.Millisecond, 2, func() error { calls++; return nil })
	// One clock reading per call after the start: 5 calls reach 50 ms.
	if err != nil || n != 5 || calls != 5 || d != 50*time.Millisecond {
		t.Fatalf("loop = %d calls, %v, %v; want 5, 50ms, nil", n, d, err)
	}
	n, _, _ = loop(context.Background(), c.now, time.Nanosecond, 4, func() error { return nil })
	if n != 4 {
		t.Fatalf("loop made %d calls, want the minimum 4", n)
	}
	boom := errors.New("boom")
	if _, _, err := loop(context.Background(), c.now, time.Second, 1, func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("loop error = %v, want boom", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := loop(ctx, c.now, time.Second, 1, func() error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("loop on a cancelled context = %v", err)
	}
}

func TestStateBytesAndMemory(t *testing.T) {
	plan, err := partition.New(mnistMLP, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		opt    string
		copies int64
	}{{"sgd", 1}, {"momentum", 2}, {"adam", 3}} {
		got, err := StateBytes(plan, 1, tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		if want := 4 * int64(plan.Shards[1].Size) * tc.copies; got != want {
			t.Errorf("%s: StateBytes = %d, want %d", tc.opt, got, want)
		}
	}
	if _, err := StateBytes(plan, 0, "rmsprop"); err == nil {
		t.Error("unknown optimizer accepted")
	}
	if _, err := StateBytes(plan, 2, "sgd"); err == nil {
		t.Error("shard out of range accepted")
	}

	s0 := 8 * int64(plan.Shards[0].Size) // momentum: params + velocity
	s1 := 8 * int64(plan.Shards[1].Size)
	rep := &report.Report{Model: "784-800-10", PS: 2, Optimizer: "momentum", Tasks: map[string]report.Task{
		"ps/0": {PeakRSSBytes: 2 * s0}, "ps/1": {PeakRSSBytes: 3*s1 + 41<<20}, "chief": {PeakRSSBytes: 1 << 30}}}
	m, err := Memory(rep)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) != 2 || m.Shards[0].StateBytes != s0 || m.Shards[1].StateBytes != s1 {
		t.Fatalf("Memory shards = %+v", m.Shards)
	}
	if !near(m.Shards[0].RSSOverState, 2) || !m.Shards[0].MeetsGoal {
		t.Errorf("ps/0 = %+v, want ratio 2 and within the goal", m.Shards[0])
	}
	if m.Shards[1].MeetsGoal || m.MeetsGoal || m.Shards[1].GoalBytes != 3*s1+40<<20 {
		t.Errorf("ps/1 = %+v (overall %v), want over the goal of 3*state+40MiB", m.Shards[1], m.MeetsGoal)
	}
	if !near(m.PSRSSOverState, m.Shards[1].RSSOverState) {
		t.Errorf("PSRSSOverState = %v, want the largest shard ratio %v", m.PSRSSOverState, m.Shards[1].RSSOverState)
	}
	if m.Roles.Chief.PeakRSSBytes != 1<<30 || m.Roles.Chief.MeetsGoal || m.Roles.Worker.Tasks != 0 {
		t.Errorf("roles: %+v", m.Roles)
	}
	delete(rep.Tasks, "ps/1")
	if _, err := Memory(rep); err == nil || !strings.Contains(err.Error(), "ps/1") {
		t.Errorf("missing task: err = %v, want it named", err)
	}
	rep.Workers = 1
	if _, err := Memory(rep); err == nil || !strings.Contains(err.Error(), "worker/0") {
		t.Errorf("missing worker: err = %v, want it named", err)
	}
}

func TestParseModel(t *testing.T) {
	s, err := ParseModel("784-256-128-10")
	if err != nil || s.Input != 784 || len(s.Hidden) != 2 || s.Hidden[1] != 128 || s.Classes != 10 {
		t.Fatalf("ParseModel = %+v, %v", s, err)
	}
	if s.String() != "784-256-128-10" {
		t.Fatalf("round trip gives %s", s)
	}
	for _, bad := range []string{"", "784", "784-x-10", "784-0-10"} {
		if _, err := ParseModel(bad); err == nil {
			t.Errorf("ParseModel(%q) accepted", bad)
		}
	}
}

func TestParseSections(t *testing.T) {
	got, err := ParseSections("memory, compute,memory")
	if err != nil || strings.Join(got, ",") != "compute,memory" {
		t.Fatalf("ParseSections = %v, %v; want canonical order without duplicates", got, err)
	}
	if all, _ := ParseSections(""); len(all) != 8 || slices.Contains(all, SectionNetwork) {
		t.Fatalf("empty list gives %v, want all 8 (not network)", all)
	}
	if n, err := ParseSections("network"); err != nil || !slices.Equal(n, []string{SectionNetwork}) {
		t.Fatalf("ParseSections(network) = %v, %v", n, err)
	}
	if _, err := ParseSections("compute,gpu"); err == nil || !strings.Contains(err.Error(), `"gpu"`) {
		t.Fatalf("unknown section: err = %v", err)
	}
}

// TestResultJSONKeys checks the keys the architecture contract fixes.
func TestResultJSONKeys(t *testing.T) {
	ttt := 9.5
	r := &Result{Compute: &ComputeResult{}, Wire: &WireResult{}, PSOverhead: &OverheadResult{},
		EndToEnd: &E2EResult{TimeToTargetSeconds: &ttt}, Memory: &MemoryResult{}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	m := map[string]map[string]any{}
	for sec, raw := range top {
		var obj map[string]any
		if json.Unmarshal(raw, &obj) == nil {
			m[sec] = obj
		}
	}
	for _, k := range []string{"compute.samples_per_second", "compute.fraction_of_ceiling", "wire.mb_per_second",
		"wire.fraction_of_tcp", "ps_overhead.ratio", "end_to_end.time_to_target_seconds", "end_to_end.wall_seconds",
		"memory.ps_rss_over_state", "compute.gflops", "machine.date", "memory.roles", "memory.total_peak_rss_bytes"} {
		sec, key, _ := strings.Cut(k, ".")
		if _, ok := m[sec][key]; !ok {
			t.Errorf("JSON lacks %s: %s", k, b)
		}
	}
	// Each role's figures.
	// memory.roles.{ps,worker,chief}.peak_rss_bytes (the architecture's
	// contract), with the role's task count and goal.
	roles, _ := m["memory"]["roles"].(map[string]any)
	for _, role := range []string{"worker", "chief", "ps"} {
		fig, ok := roles[role].(map[string]any)
		if !ok {
			t.Fatalf("memory.roles.%s is not an object: %s", role, b)
		}
		for _, k := range []string{"tasks", "peak_rss_bytes", "meets_goal"} {
			if _, ok := fig[k]; !ok {
				t.Errorf("memory.roles.%s lacks %s: %s", role, k, b)
			}
		}
	}
	// A run that never reached the target says null, not 0.
	r.EndToEnd.TimeToTargetSeconds = nil
	b, _ = json.Marshal(r)
	if !strings.Contains(string(b), `"time_to_target_seconds":null`) {
		t.Errorf("unreached target not null: %s", b)
	}
	// Sections not run are absent.
	b, _ = json.Marshal(&Result{Wire: &WireResult{}})
	if strings.Contains(string(b), `"compute"`) || !strings.Contains(string(b), `"wire"`) {
		t.Errorf("absent sections encoded: %s", b)
	}
}
