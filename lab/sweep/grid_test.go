package sweep

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// fakeResolve fills defaults for every key and rejects workers < 1, like
// the real resolver does through `pstrain run --dry-run`.
func fakeResolve(p map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for _, k := range Keys() {
		out[k] = "1"
	}
	out["mode"], out["model"] = "sync", "mlp"
	for k, v := range p {
		out[k] = v
	}
	if out["workers"] == "0" {
		return nil, errors.New("--workers must be at least 1, got 0")
	}
	return out, nil
}

func TestParseGrid(t *testing.T) {
	g, err := ParseGrid(" mode=sync,async ; workers=1,2,4;hidden=800,256+128;")
	if err != nil {
		t.Fatal(err)
	}
	want := Grid{{"mode", []string{"sync", "async"}}, {"workers", []string{"1", "2", "4"}}, {"hidden", []string{"800", "256+128"}}}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("got %v", g)
	}
	if g.Size() != 12 || !reflect.DeepEqual(g.Varied(), []string{"mode", "workers", "hidden"}) {
		t.Errorf("size %d varied %v", g.Size(), g.Varied())
	}
	if g.String() != "mode=sync,async;workers=1,2,4;hidden=800,256+128" {
		t.Errorf("String %q", g.String())
	}
}

func TestParseGridErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"":                            "empty specification",
		"wrokers=1,2":                 `unknown key "wrokers"`,
		"workers":                     "want KEY=VALUE",
		"workers=1,,2":                `key "workers" has an empty value`,
		"workers=1;workers=2":         `key "workers" appears twice`,
		"mode=sync,sync":              `key "mode" lists value "sync" twice`,
		"data-dir=/tmp":               `unknown key "data-dir"`,
		"=3":                          "want KEY=VALUE",
		"lr=0.1;heartbeat-timeout=1s": `unknown key "heartbeat-timeout"`,
	} {
		_, err := ParseGrid(spec)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseGrid(%q) = %v, want error containing %q", spec, err, want)
		}
	}
}

func TestExpand(t *testing.T) {
	g, _ := ParseGrid("mode=sync,async;hidden=800,256+128")
	cs, err := g.Expand(fakeResolve, 2)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cs {
		got = append(got, c.Params["mode"]+"/"+c.Params["hidden"])
		if len(c.Params) != len(Keys()) || len(c.ID) != 10 {
			t.Errorf("config %+v", c)
		}
	}
	if want := []string{"sync/800", "sync/256,128", "async/800", "async/256,128"}; !reflect.DeepEqual(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	// IDs depend on the parameters, not on the grid's order.
	g2, _ := ParseGrid("hidden=256+128,800;mode=async,sync")
	cs2, _ := g2.Expand(fakeResolve, 2)
	ids := map[string]bool{}
	for _, c := range cs {
		ids[c.ID] = true
	}
	for _, c := range cs2 {
		if !ids[c.ID] {
			t.Errorf("config %v has a new ID %s after reordering the grid", c.Params, c.ID)
		}
	}
	if len(ids) != 4 {
		t.Errorf("%d distinct IDs, want 4", len(ids))
	}
}

func TestExpandNamesBadConfiguration(t *testing.T) {
	g, _ := ParseGrid("mode=sync;workers=2,0")
	_, err := g.Expand(fakeResolve, 2)
	if err == nil || !strings.Contains(err.Error(), "workers=0") || !strings.Contains(err.Error(), "--workers must be at least 1") {
		t.Fatalf("err = %v", err)
	}
}

func TestSpreadOf(t *testing.T) {
	s := SpreadOf([]float64{3, math.NaN(), 1, 10, 2})
	if s.N != 4 || s.Median != 2.5 || s.Min != 1 || s.Max != 10 {
		t.Errorf("%+v", s)
	}
	if s := SpreadOf([]float64{5, 1, 3}); s.Median != 3 {
		t.Errorf("odd median %v", s.Median)
	}
	if s := SpreadOf([]float64{math.NaN()}); s.N != 0 || !math.IsNaN(s.Median) {
		t.Errorf("empty %+v", s)
	}
}

func sampleRows() []Row {
	var rows []Row
	for i, mode := range []string{"sync", "sync", "async", "async"} {
		p, _ := fakeResolve(map[string]string{"mode": mode})
		rows = append(rows, Row{
			RunID: fmt.Sprintf("%s-r%d", mode, i%2), ConfigID: mode, Repeat: i % 2, Status: StatusOK, Params: p, Seed: int64(1 + i%2),
			GlobalSteps: int64(100 + i), TrainSeconds: float64(10 + i), TestAccuracy: 0.9 + 0.01*float64(i),
			BestTestAccuracy: 0.95, TimeToTargetSeconds: math.NaN(), SamplesPerSecond: 1000, CPUTotal: float64(20 + i),
			RSSTotal: 5 << 20, Load1Mean: 1.5, Load1Max: 2, StoppedBy: "epochs",
			CPUsAllowed: "0-1", RunCPUSeconds: 21.5, HostCPUSeconds: 30, OtherCPUSeconds: 8.5, RunQueueMean: 2.25, RunQueueMax: 5,
			Bottleneck: "compute", PhaseCompute: 0.6, PhasePush: 0.1, PhasePull: 0.1, PhaseBarrier: 0.2, PhaseWait: 0,
		})
	}
	rows[0].TimeToTargetSeconds = 7.5
	return rows
}

func TestCSVRoundTrip(t *testing.T) {
	rows := sampleRows()
	rows[3].Status, rows[3].Error = StatusFailed, "exit status 1,\n\"boom\""
	var buf bytes.Buffer
	if err := WriteCSV(&buf, rows); err != nil {
		t.Fatal(err)
	}
	header, _, _ := strings.Cut(buf.String(), "\n")
	for _, col := range []string{"run_id", "mode", "data-fraction", "train_seconds", "test_seconds", "samples_per_second", "test_accuracy",
		"best_test_accuracy", "time_to_target_seconds", "cpu_seconds_ps", "peak_rss_bytes_worker", "load1_mean", "load1_max",
		"stale_gradients_dropped", "restarts", "model", "cpus", "cpus_allowed", "cpu_seconds_run", "host_cpu_seconds", "other_cpu_seconds",
		"run_queue_mean", "run_queue_max", "bottleneck", "phase_compute", "phase_push", "phase_pull", "phase_barrier_wait", "phase_wait"} {
		if !strings.Contains(","+header+",", ","+col+",") {
			t.Errorf("header lacks %s: %s", col, header)
		}
	}
	got, err := ReadCSV(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(rows) {
		t.Fatalf("%d rows back", len(got))
	}
	for i := range rows {
		// NaN != NaN: compare through the CSV rendering.
		var a, b bytes.Buffer
		WriteCSV(&a, rows[i:i+1])
		WriteCSV(&b, got[i:i+1])
		if a.String() != b.String() {
			t.Errorf("row %d:\n%s\n%s", i, a.String(), b.String())
		}
	}
	if !math.IsNaN(got[1].TimeToTargetSeconds) || got[0].TimeToTargetSeconds != 7.5 {
		t.Errorf("time to target %v %v", got[0].TimeToTargetSeconds, got[1].TimeToTargetSeconds)
	}
	if _, err := ReadCSV(strings.NewReader("a,b\n1,2\n")); err == nil {
		t.Error("a CSV without run_id was accepted")
	}
	if _, err := ReadCSV(strings.NewReader("run_id,train_seconds\nx,abc\n")); err == nil || !strings.Contains(err.Error(), "train_seconds") {
		t.Errorf("bad number: %v", err)
	}
}

func TestSummary(t *testing.T) {
	rows := sampleRows()
	var buf bytes.Buffer
	WriteSummary(&buf, rows)
	s := buf.String()
	for _, want := range []string{
		"4 runs finished",
		"## By configuration (over repeats)",
		"## By mode (other parameters pooled)",
		"| mode=sync | 2 | 10.5 (10.0–11.0) |",        // train seconds: median (range)
		"| sync | 2 | 10.5 (10.0–11.0) |",             // the per-parameter table
		"| 90.50 (90.00–91.00) | 95.00 | 7.5 [1/2] |", // accuracy, best, time to target reached by 1 of 2
		"Fixed parameters: model=mlp workers=1",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "## By workers") {
		t.Error("a table for a parameter that did not vary")
	}
}

// A key whose value follows from an earlier varied key (model=cnn brings
// its own warmup and hidden sizes) is not an axis of its own; two keys
// crossed in the grid both are.
func TestVariedKeysLeaveOutConsequences(t *testing.T) {
	cfg := func(kv ...string) Config {
		p := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			p[kv[i]] = kv[i+1]
		}
		return Config{Params: p}
	}
	var configs []Config
	for _, cpus := range []string{"1", "2"} {
		configs = append(configs,
			cfg("model", "mlp", "cpus", cpus, "warmup-steps", "0", "hidden", "800", "lr", "0.2"),
			cfg("model", "cnn", "cpus", cpus, "warmup-steps", "200", "hidden", "256", "lr", "0.2"))
	}
	if got := variedKeys(configs); !slices.Equal(got, []string{"model", "cpus"}) {
		t.Errorf("varied keys %v, want [model cpus]", got)
	}
	// lr crossed with hidden: neither fixes the other.
	configs = nil
	for _, lr := range []string{"0.1", "0.2"} {
		for _, h := range []string{"100", "200"} {
			configs = append(configs, cfg("lr", lr, "hidden", h))
		}
	}
	if got := variedKeys(configs); !slices.Equal(got, []string{"lr", "hidden"}) {
		t.Errorf("varied keys %v, want [lr hidden]", got)
	}
}

// The summary's fixed parameters give a consequence of a varied key with
// each of its values, not the first row's value as if it held for all.
func TestSummaryFixedFollowsModel(t *testing.T) {
	var rows []Row
	for _, m := range []struct{ model, lr string }{{"mlp", "0.2"}, {"cnn", "0.05"}} {
		rows = append(rows, Row{RunID: m.model, Status: StatusOK, Params: map[string]string{"model": m.model, "lr": m.lr, "workers": "2"}})
	}
	var buf bytes.Buffer
	WriteSummary(&buf, rows)
	if want := "lr=(0.2 with model=mlp, 0.05 with model=cnn)"; !strings.Contains(buf.String(), want) {
		t.Errorf("summary lacks %q:\n%s", want, buf.String())
	}
	if !strings.Contains(buf.String(), " workers=2") {
		t.Errorf("summary lacks the fixed workers=2:\n%s", buf.String())
	}
}

// conv takes several layers in a grid as hidden does: 8+16 is --conv=8,16.
func TestConvValueSyntax(t *testing.T) {
	if got := flagValue("conv", "8+16"); got != "8,16" {
		t.Errorf("flagValue(conv, 8+16) = %q, want 8,16", got)
	}
}
