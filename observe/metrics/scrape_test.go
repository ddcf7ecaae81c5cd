package metrics

import (
	"math"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
)

const sampleExposition = `# HELP req_total Requests.
# TYPE req_total counter
req_total{op="pull",shard="0"} 3
req_total{op="push",shard="0"} 5
req_total{op="push",shard="1"} 7
# HELP temp Untyped thing.
# TYPE temp untyped
temp 1.5
# HELP lat_seconds Latency.
# TYPE lat_seconds histogram
lat_seconds_bucket{op="a",le="0.1"} 1
lat_seconds_bucket{op="a",le="0.2"} 3
lat_seconds_bucket{op="a",le="0.4"} 4
lat_seconds_bucket{op="a",le="+Inf"} 4
lat_seconds_sum{op="a"} 0.7
lat_seconds_count{op="a"} 4
lat_seconds_bucket{op="b",le="0.1"} 0
lat_seconds_bucket{op="b",le="0.2"} 0
lat_seconds_bucket{op="b",le="0.4"} 2
lat_seconds_bucket{op="b",le="+Inf"} 4
lat_seconds_sum{op="b"} 3
lat_seconds_count{op="b"} 4
`

func parseSample(t *testing.T) Families {
	t.Helper()
	fams, err := Parse(strings.NewReader(sampleExposition), expfmt.NewFormat(expfmt.TypeTextPlain))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func TestFamiliesScalars(t *testing.T) {
	f := parseSample(t)
	if got, want := strings.Join(f.Names(), ","), "lat_seconds,req_total,temp"; got != want {
		t.Errorf("Names = %s, want %s", got, want)
	}
	if v, ok := f.Value("req_total", map[string]string{"op": "pull"}); !ok || v != 3 {
		t.Errorf("Value(pull) = %v, %v; want 3", v, ok)
	}
	if v, ok := f.Value("req_total", map[string]string{"op": "push", "shard": "1"}); !ok || v != 7 {
		t.Errorf("Value(push, 1) = %v, %v; want 7", v, ok)
	}
	if _, ok := f.Value("req_total", map[string]string{"op": "push"}); ok {
		t.Error("Value(push) succeeded although two series match")
	}
	if _, ok := f.Value("req_total", map[string]string{"op": "nope"}); ok {
		t.Error("Value(nope) succeeded")
	}
	if _, ok := f.Value("missing", nil); ok {
		t.Error("Value(missing) succeeded")
	}
	if _, ok := f.Value("lat_seconds", map[string]string{"op": "a"}); ok {
		t.Error("Value on a histogram succeeded")
	}
	if v, ok := f.Value("temp", nil); !ok || v != 1.5 {
		t.Errorf("Value(temp) = %v, %v; want 1.5", v, ok)
	}
	// An absent label matches the empty value, as in PromQL.
	if v, ok := f.Value("temp", map[string]string{"op": ""}); !ok || v != 1.5 {
		t.Errorf(`Value(temp, op="") = %v, %v; want 1.5`, v, ok)
	}
	if got := f.Sum("req_total", nil); got != 15 {
		t.Errorf("Sum = %v, want 15", got)
	}
	if got := f.Sum("req_total", map[string]string{"op": "push"}); got != 12 {
		t.Errorf("Sum(push) = %v, want 12", got)
	}
	if got := f.Sum("missing", nil); got != 0 {
		t.Errorf("Sum(missing) = %v, want 0", got)
	}
	if s := f.Series("req_total", map[string]string{"shard": "0"}); len(s) != 2 || s[1].Labels["op"] != "push" || s[1].Value != 5 {
		t.Errorf("Series(shard 0) = %+v", s)
	}
}

func TestFamiliesHistogram(t *testing.T) {
	f := parseSample(t)
	a, ok := f.Histogram("lat_seconds", map[string]string{"op": "a"})
	if !ok || a.Count != 4 || a.Sum != 0.7 || len(a.Buckets) != 3 {
		t.Fatalf("Histogram(a) = %+v, %v", a, ok)
	}
	if got := a.Mean(); math.Abs(got-0.175) > 1e-12 {
		t.Errorf("Mean = %v, want 0.175", got)
	}
	// Rank 2 of 4 lies halfway through the (0.1, 0.2] bucket.
	if got := a.Quantile(0.5); math.Abs(got-0.15) > 1e-12 {
		t.Errorf("a.Quantile(0.5) = %v, want 0.15", got)
	}
	if got := a.Quantile(0.25); math.Abs(got-0.1) > 1e-12 {
		t.Errorf("a.Quantile(0.25) = %v, want 0.1", got)
	}

	all, ok := f.Histogram("lat_seconds", nil)
	if !ok || all.Count != 8 || all.Sum != 3.7 {
		t.Fatalf("Histogram(all) = %+v, %v", all, ok)
	}
	want := []Bucket{{0.1, 1}, {0.2, 3}, {0.4, 6}}
	for i, b := range want {
		if all.Buckets[i] != b {
			t.Errorf("bucket %d = %+v, want %+v", i, all.Buckets[i], b)
		}
	}
	// The 0.99 rank falls in +Inf: the highest finite bound is returned.
	if got := all.Quantile(0.99); got != 0.4 {
		t.Errorf("Quantile(0.99) = %v, want 0.4", got)
	}
	if !math.IsNaN(all.Quantile(1.5)) || !math.IsNaN((Histogram{}).Quantile(0.5)) || !math.IsNaN((Histogram{}).Mean()) {
		t.Error("want NaN for an out-of-range q or an empty histogram")
	}
	if _, ok := f.Histogram("req_total", nil); ok {
		t.Error("Histogram on a counter succeeded")
	}
	if _, ok := f.Histogram("lat_seconds", map[string]string{"op": "c"}); ok {
		t.Error("Histogram with no matching series succeeded")
	}
}

func TestQuantileZeroBucket(t *testing.T) {
	h := Histogram{Count: 4, Buckets: []Bucket{{0, 2}, {1, 3}, {2, 4}}}
	if got := h.Quantile(0.25); got != 0 {
		t.Errorf("Quantile(0.25) = %v, want 0 (inside the le=0 bucket)", got)
	}
	if got := h.Quantile(0.75); got != 1 {
		t.Errorf("Quantile(0.75) = %v, want 1", got)
	}
}

func TestParseRejectsGarbage(t *testing.T) {
	if _, err := Parse(strings.NewReader("this is { not metrics\n"), expfmt.NewFormat(expfmt.TypeTextPlain)); err == nil {
		t.Fatal("Parse accepted garbage")
	}
}
