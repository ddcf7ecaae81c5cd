package main

import (
	"bytes"
	"encoding/json"
	"image/png"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/pstrain/pstrain/tools/dashboard"
)

const testDashboard = "../../scripts/grafana/dashboards/pstrain.json"

// fakeProm answers /api/v1/query_range with two synthetic series for any
// query, and counts the queries it was asked.
type fakeProm struct {
	mu      sync.Mutex
	queries map[string]int
	bad     []string
}

func (f *fakeProm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/query_range" || r.ParseForm() != nil {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	start, err1 := strconv.ParseFloat(r.Form.Get("start"), 64)
	end, err2 := strconv.ParseFloat(r.Form.Get("end"), 64)
	step, err3 := strconv.ParseFloat(r.Form.Get("step"), 64)
	f.mu.Lock()
	f.queries[r.Form.Get("query")]++
	if err1 != nil || err2 != nil || err3 != nil || step != 1 || end-start != 60 {
		f.bad = append(f.bad, r.Form.Encode())
	}
	f.mu.Unlock()
	type series struct {
		Metric map[string]string `json:"metric"`
		Values [][2]any          `json:"values"`
	}
	var result []series
	for i, task := range []string{"worker/0", "worker/1"} {
		s := series{Metric: map[string]string{"task": task, "phase": "compute", "op": "push",
			"host": "127.0.0.1", "le": []string{"1", "+Inf"}[i]}}
		for t := start; t <= end; t += step {
			v := float64(i+1) * (1.5 + math.Sin((t-start)/7))
			if i == 0 && t-start > 20 && t-start < 25 {
				s.Values = append(s.Values, [2]any{t, "NaN"}) // a hole
				continue
			}
			s.Values = append(s.Values, [2]any{t, strconv.FormatFloat(v, 'f', -1, 64)})
		}
		result = append(result, s)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"status": "success",
		"data": map[string]any{"resultType": "matrix", "result": result}})
}

func TestRenderAgainstFakePrometheus(t *testing.T) {
	fp := &fakeProm{queries: map[string]int{}}
	srv := httptest.NewServer(fp)
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "img", "dashboard.png")
	var stdout, stderr bytes.Buffer
	args := []string{"--dashboard", testDashboard, "--prom-url", srv.URL,
		"--start", "1700000000", "--end", "1700000060", "--step", "1s", "--rate-interval", "5s",
		"--out", out, "--width", "1800"}
	if err := run(t.Context(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	t.Log(stdout.String())

	// Every query of every panel was evaluated once, with the range asked for.
	vars := dashboard.DefaultVariables()
	vars["__rate_interval"] = "5s"
	qs, err := dashboard.PanelQueriesWith(testDashboard, vars)
	if err != nil {
		t.Fatal(err)
	}
	panels := map[string]bool{}
	total := 0
	for _, q := range qs {
		if n := fp.queries[q.Expr]; n == 0 {
			t.Errorf("%s was not queried: %s", q, q.Expr)
		} else {
			panels[q.Panel] = true
		}
	}
	for _, n := range fp.queries {
		total += n
	}
	if total != len(qs) {
		t.Errorf("%d requests for %d queries", total, len(qs))
	}
	if len(fp.bad) > 0 {
		t.Errorf("requests with an unexpected range: %q", fp.bad)
	}
	d, err := loadDashboard(testDashboard, vars, titleVars(vars))
	if err != nil {
		t.Fatal(err)
	}
	if n := countPanels(d); len(panels) != n || n < 20 {
		t.Errorf("%d panels queried, the dashboard has %d", len(panels), n)
	}

	// The PNG decodes, with the size the layout gives.
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	wantW, wantH := pictureSize(1800, d.Rows())
	if b := img.Bounds(); b.Dx() != wantW || b.Dy() != wantH || wantH < 2000 {
		t.Errorf("picture is %dx%d, want %dx%d", b.Dx(), b.Dy(), wantW, wantH)
	}
	if st, _ := f.Stat(); st.Size() > 400<<10 {
		t.Errorf("picture is %d KB, want at most 400", st.Size()>>10)
	}
}

func TestRenderFailsWithoutPrometheus(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // nothing listens any more
	out := filepath.Join(t.TempDir(), "x.png")
	err := run(t.Context(), []string{"--dashboard", testDashboard, "--prom-url", srv.URL, "--last", "10s", "--out", out}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil {
		t.Fatal("run succeeded with no Prometheus")
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a picture was written with no Prometheus")
	}
}

func TestFormatValue(t *testing.T) {
	for _, c := range []struct {
		unit   string
		v, ref float64
		res    float64
		want   string
	}{
		{"short", 2340, 2340, 0, "2.34 K"},
		{"short", 0, 20000, 5000, "0"},
		{"percentunit", 0.982, 0.982, 0, "98.2%"},
		{"percentunit", 0.5, 1, 0.25, "50%"},
		{"s", 0.0123, 0.0123, 0, "12.3 ms"},
		{"bytes", 4.85 * 1024 * 1024, 4.85 * 1024 * 1024, 0, "4.85 MiB"},
		{"Bps", 41.4e6, 41.4e6, 0, "41.4 MB/s"},
		{"reqps", 70.5, 70.5, 0, "70.5 req/s"},
		{"none", math.NaN(), 1, 0, "–"},
	} {
		if got := formatValue(c.unit, c.v, c.ref, c.res); got != c.want {
			t.Errorf("formatValue(%q, %v) = %q, want %q", c.unit, c.v, got, c.want)
		}
	}
}

func TestLegendName(t *testing.T) {
	l := map[string]string{"__name__": "up", "task": "ps/1", "job": "pstrain"}
	for format, want := range map[string]string{
		"{{task}} sent": "ps/1 sent",
		"{{ task }}":    "ps/1",
		"eval":          "eval",
		"":              `up{job="pstrain", task="ps/1"}`,
	} {
		if got := legendName(format, l); got != want {
			t.Errorf("legendName(%q) = %q, want %q", format, got, want)
		}
	}
	if !naturalLess("worker/2", "worker/10") || naturalLess("ps/1", "ps/0") {
		t.Error("naturalLess")
	}
}
