package dashboard

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pstrain/pstrain/observe/metrics"
)

// Paths relative to this package's directory (go test runs tests there).
var (
	dashboardPath  = filepath.Join("..", "..", File)
	datasourcePath = filepath.Join("..", "..", "scripts", "grafana", "provisioning", "datasources", "pstrain.yaml")
	metricsDir     = filepath.Join("..", "..", "observe", "metrics")
)

// datasourceVar is the name of the dashboard's datasource variable; panels
// and targets must refer to it rather than to a concrete datasource.
const datasourceVar = "datasource"

// findLinter returns the path of the dashboard-linter binary: $PATH first,
// then $GOBIN and $GOPATH/bin, where `go install` puts it (and which are often
// not on $PATH). It returns "" if there is none.
func findLinter() string {
	if p, err := exec.LookPath("dashboard-linter"); err == nil {
		return p
	}
	var dirs []string
	if gobin := os.Getenv("GOBIN"); gobin != "" {
		dirs = append(dirs, gobin)
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if home, err := os.UserHomeDir(); err == nil {
			gopath = filepath.Join(home, "go")
		}
	}
	for _, dir := range filepath.SplitList(gopath) {
		dirs = append(dirs, filepath.Join(dir, "bin"))
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, "dashboard-linter")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// TestDashboardLint runs grafana's dashboard-linter in strict mode (any error
// or warning fails) on the dashboard. Exclusions, if ever needed, go in a
// .lint file next to the dashboard, which the linter reads by itself.
func TestDashboardLint(t *testing.T) {
	linter := findLinter()
	if linter == "" {
		msg := "dashboard-linter is not installed; run scripts/grafana/lint.sh once to install it " +
			"(it is github.com/grafana/dashboard-linter@v0.0.0-20241224134444-1765d94aec4a)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + "; CI=true, so this is a failure rather than a skip")
		}
		t.Skip(msg)
	}
	cmd := exec.Command(linter, "lint", "--strict", dashboardPath)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	// Drop the rule descriptions the linter prints on every run.
	var findings []string
	for _, line := range strings.Split(out.String(), "\n") {
		if line != "" && !strings.HasPrefix(line, "Checks ") {
			findings = append(findings, line)
		}
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		t.Errorf("dashboard-linter lint --strict %s failed:\n%s", dashboardPath, strings.Join(findings, "\n"))
	case err != nil:
		t.Fatalf("running %s: %v", linter, err)
	case len(findings) > 0:
		t.Errorf("dashboard-linter printed findings:\n%s", strings.Join(findings, "\n"))
	}
}

// TestDashboardStructure checks what the linter does not: that the dashboard
// is the one Grafana provisioning expects, that every panel is complete, and
// above all that every metric a query names is exported by pstrain, so a typo
// in a query or a renamed metric fails here rather than as an empty panel.
func TestDashboardStructure(t *testing.T) {
	d, err := load(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if d.UID != "pstrain" || d.Title != "pstrain" {
		t.Errorf("uid, title = %q, %q; want pstrain, pstrain", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion = %d; want at least 36 (Grafana 9+)", d.SchemaVersion)
	}

	// Template variables.
	vars := map[string]variableJSON{}
	for _, v := range d.Templating.List {
		if _, dup := vars[v.Name]; dup {
			t.Errorf("template variable %q defined twice", v.Name)
		}
		vars[v.Name] = v
	}
	ds, ok := vars[datasourceVar]
	switch {
	case !ok:
		t.Errorf("no %q template variable", datasourceVar)
	case ds.Type != "datasource" || string(ds.Query) != `"prometheus"`:
		t.Errorf("variable %q: type %q, query %s; want a prometheus datasource variable", datasourceVar, ds.Type, ds.Query)
	default:
		var cur struct {
			Value string `json:"value"`
		}
		if err := json.Unmarshal(ds.Current, &cur); err != nil {
			t.Errorf("variable %q: current: %v", datasourceVar, err)
		}
		uid, err := provisionedDatasourceUID(datasourcePath)
		if err != nil {
			t.Error(err)
		} else if cur.Value != uid {
			t.Errorf("variable %q defaults to %q, but %s provisions uid %q", datasourceVar, cur.Value, datasourcePath, uid)
		}
	}
	for _, name := range []string{"job", "instance"} {
		v, ok := vars[name]
		if !ok || v.Type != "query" {
			t.Errorf("no query variable %q", name)
			continue
		}
		if !strings.Contains(string(v.Query), "label_values(") {
			t.Errorf("variable %q: query %s is not a label_values() query", name, v.Query)
		}
	}
	// Every variable a query or title uses must be defined by the dashboard
	// (or be a Grafana global), and every dashboard variable must have a
	// value in DefaultVariables so PanelQueries can evaluate queries.
	defaults := DefaultVariables()
	for name := range vars {
		if _, ok := defaults[name]; !ok && name != datasourceVar {
			t.Errorf("dashboard variable $%s has no value in DefaultVariables", name)
		}
	}
	known := map[string]string{}
	for name := range vars {
		known[name] = "x"
	}
	for name := range defaults {
		if strings.HasPrefix(name, "__") {
			known[name] = "x"
		}
	}

	allowed := knownMetricNames(t)
	ids := map[int]string{}
	panels := d.allPanels()
	if len(panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	for _, p := range panels {
		name := p.Title
		if name == "" {
			name = "panel id " + strconv.Itoa(p.ID)
			t.Errorf("%s has no title", name)
		}
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, name, p.ID)
		}
		ids[p.ID] = name
		if _, err := Substitute(p.Title, known); err != nil {
			t.Errorf("panel %q title: %v", name, err)
		}
		if p.Repeat != "" {
			if _, ok := vars[p.Repeat]; !ok {
				t.Errorf("panel %q repeats over undefined variable $%s", name, p.Repeat)
			}
		}
		if !isDatasourceVar(p.Datasource.UID) {
			t.Errorf("panel %q datasource uid is %q; want ${%s}", name, p.Datasource.UID, datasourceVar)
		}
		if u := panelUnit(p); u == "" {
			t.Errorf("panel %q (%s) has no unit", name, p.Type)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", name)
		}
		refs := map[string]bool{}
		for i, tg := range p.Targets {
			where := "panel " + strconv.Quote(name) + " target " + strconv.Itoa(i) + " (" + tg.RefID + ")"
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: refId missing or duplicated", where)
			}
			refs[tg.RefID] = true
			if tg.Datasource != nil && !isDatasourceVar(tg.Datasource.UID) {
				t.Errorf("%s: datasource uid is %q; want ${%s}", where, tg.Datasource.UID, datasourceVar)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: empty expr", where)
				continue
			}
			if _, err := Substitute(tg.Expr, known); err != nil {
				t.Errorf("%s: %v", where, err)
			}
			names, err := metricNames(tg.Expr)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if len(names) == 0 && !strings.Contains(tg.Expr, "time()") {
				t.Errorf("%s: expr %q selects no metric", where, tg.Expr)
			}
			for _, m := range names {
				if !allowed[m] {
					t.Errorf("%s: metric %q is not exported by pstrain (expr %s)", where, m, tg.Expr)
				}
			}
		}
	}
}

func isDatasourceVar(uid string) bool {
	return uid == "$"+datasourceVar || uid == "${"+datasourceVar+"}"
}

// panelUnit returns the unit a panel displays its values in: the field
// config's default unit, or for a heatmap the unit of its y axis.
func panelUnit(p panelJSON) string {
	var fc struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	}
	var opts struct {
		YAxis struct {
			Unit string `json:"unit"`
		} `json:"yAxis"`
	}
	if len(p.FieldConfig) > 0 {
		_ = json.Unmarshal(p.FieldConfig, &fc)
	}
	if len(p.Options) > 0 {
		_ = json.Unmarshal(p.Options, &opts)
	}
	if p.Type == "heatmap" {
		return opts.YAxis.Unit
	}
	return fc.Defaults.Unit
}

// provisionedDatasourceUID returns the uid of the (single) datasource in a
// Grafana datasource provisioning file. It reads the "uid:" line rather than
// parsing YAML, which is enough for the file this repository ships.
func provisionedDatasourceUID(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var uids []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "uid:"); ok {
			uids = append(uids, strings.Trim(strings.TrimSpace(v), `"'`))
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	if len(uids) != 1 {
		return "", errors.New(path + ": want exactly one datasource uid, found " + strconv.Itoa(len(uids)))
	}
	return uids[0], nil
}

// metricConstants lists every Metric* constant of package metrics. Dashboard
// queries may only use these names (and the process, Go runtime and
// scrape-generated series listed in knownMetricNames). When a constant is
// added to package metrics, TestMetricConstantsComplete asks for it here.
var metricConstants = []string{
	metrics.MetricBuildInfo,
	metrics.MetricHostLoad1,
	metrics.MetricHostLoad5,
	metrics.MetricHostLoad15,
	metrics.MetricHostCPUSeconds,
	metrics.MetricHostCPUs,
	metrics.MetricHostMemoryAvailableBytes,
	metrics.MetricHostMemoryTotalBytes,
	metrics.MetricRPCSentBytes,
	metrics.MetricRPCReceivedBytes,
	metrics.MetricGlobalStep,
	metrics.MetricWorkerSteps,
	metrics.MetricWorkerSamples,
	metrics.MetricWorkerStepPhase,
	metrics.MetricTrainLoss,
	metrics.MetricWorkerRetries,
	metrics.MetricPSRequests,
	metrics.MetricPSRequestDuration,
	metrics.MetricPSGradientStaleness,
	metrics.MetricPSStaleGradientsDropped,
	metrics.MetricSyncBarrierWait,
	metrics.MetricPSShardParameters,
	metrics.MetricPSRejectedRequests,
	metrics.MetricPSConnectionsClosed,
	metrics.MetricPSDataPlaneConnections,
	metrics.MetricPSDataPlaneBuffered,
	metrics.MetricPSRefusedGradients,
	metrics.MetricPSGradientNormRatio,
	metrics.MetricCheckpointFailures,
	metrics.MetricDivergences,
	metrics.MetricQuarantined,
	metrics.MetricEvalAccuracy,
	metrics.MetricEvalLoss,
	metrics.MetricCheckpointDuration,
	metrics.MetricCheckpointSize,
	metrics.MetricCheckpointLastSuccess,
	metrics.MetricTaskRestarts,
	metrics.MetricRecoverySeconds,
	metrics.MetricStepsLost,
	metrics.MetricLiveWorkers,
	metrics.MetricChiefRejectedRequests,
	metrics.MetricMembershipChanges,
	metrics.MetricPSReplicaRole,
	metrics.MetricPSReplicationLag,
	metrics.MetricPSReplicationLagSeconds,
	metrics.MetricPSReplicatedBytes,
	metrics.MetricPSTableRows,
	metrics.MetricPSTableBytes,
	metrics.MetricPSTableAdmissions,
	metrics.MetricPSTableEvictions,
	metrics.MetricPSTableDropped,
	metrics.MetricPSTableRowRequests,
	metrics.MetricFailovers,
	metrics.MetricWorkers,
	metrics.MetricParameterServers,
	metrics.MetricLayoutChanges,
	metrics.MetricRebalances,
	metrics.MetricWorkerShardRPC,
}

// scrapeSeries are the series Prometheus itself adds for every target.
var scrapeSeries = []string{
	"up", "scrape_duration_seconds", "scrape_samples_scraped",
	"scrape_samples_post_metric_relabeling", "scrape_series_added",
}

// knownMetricNames returns the series names dashboard queries may select:
// the names of metricConstants, the process and Go runtime metrics of
// client_golang's collectors (as registered by metrics.NewRegistry), and
// scrapeSeries. A histogram contributes its _bucket, _sum and _count series
// (not its bare name), a summary its bare name, _sum and _count. The type of
// each metric is taken from the registries the role constructors fill, so it
// cannot drift from the code.
func knownMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	types := map[string]dto.MetricType{}
	for _, reg := range populatedRegistries() {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("gathering role metrics: %v", err)
		}
		for _, mf := range mfs {
			types[mf.GetName()] = mf.GetType()
		}
	}

	names := map[string]bool{}
	add := func(name string, typ dto.MetricType) {
		switch typ {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case dto.MetricType_SUMMARY:
			names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
		default:
			names[name] = true
		}
	}
	for _, name := range metricConstants {
		typ, ok := types[name]
		if !ok {
			t.Fatalf("metric %s is not gathered from populatedRegistries; create a series for it there", name)
		}
		add(name, typ)
	}
	for name, typ := range types {
		if strings.HasPrefix(name, "process_") || strings.HasPrefix(name, "go_") {
			add(name, typ)
		}
	}
	for _, name := range scrapeSeries {
		names[name] = true
	}
	return names
}

// populatedRegistries returns registries carrying every pstrain metric, each
// metric vector with one series, the way the chief, a parameter server and a
// worker build theirs.
func populatedRegistries() []*prometheus.Registry {
	worker := metrics.NewRegistry("test")
	w := metrics.NewWorker(worker)
	w.RPCSentBytes.WithLabelValues("push")
	w.RPCReceivedBytes.WithLabelValues("pull")
	w.ShardRPC.WithLabelValues("push", "0")

	ps := metrics.NewRegistry("test")
	p := metrics.NewPS(ps)
	p.Requests.WithLabelValues("pull")
	p.RequestDuration.WithLabelValues("pull")
	p.RPCSentBytes.WithLabelValues("pull")
	p.RPCReceivedBytes.WithLabelValues("push")
	p.RejectedRequests.WithLabelValues("stale")
	p.ConnectionsClosed.WithLabelValues("data", "idle")
	p.RefusedGradients.WithLabelValues("0", "norm")
	p.ReplicaRole.WithLabelValues("primary")
	for _, v := range []*prometheus.GaugeVec{p.Tables.Rows, p.Tables.Bytes} {
		v.WithLabelValues("emb/C1")
	}
	for _, v := range []*prometheus.CounterVec{p.Tables.Admissions, p.Tables.Evictions, p.Tables.Dropped} {
		v.WithLabelValues("emb/C1")
	}
	p.Tables.RowRequests.WithLabelValues("emb/C1", "pull")

	chief := metrics.NewRegistry("test")
	c := metrics.NewChief(chief)
	c.TaskRestarts.WithLabelValues("worker/0")
	c.RejectedRequests.WithLabelValues("config")
	c.Failovers.WithLabelValues("0")

	regs := []*prometheus.Registry{worker, ps, chief}
	// NewRegistry leaves the host collector out where there is no /proc;
	// read the host metrics from package metrics' test fixture instead.
	if host, err := metrics.NewHostCollector(filepath.Join(metricsDir, "testdata", "proc")); err == nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(host)
		regs = append(regs, reg)
	}
	return regs
}

// TestMetricConstantsComplete checks that metricConstants lists every Metric*
// constant of package metrics whose value is a pstrain_ metric name, by
// reading the package's source.
func TestMetricConstantsComplete(t *testing.T) {
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(metricsDir, "*.go"))
	if err != nil || len(matches) == 0 {
		t.Fatalf("no Go files in %s (%v)", metricsDir, err)
	}
	listed := map[string]bool{}
	for _, name := range metricConstants {
		listed[name] = true
	}
	var missing []string
	for _, path := range matches {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Metric") || !id.IsExported() || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					value, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					if !strings.HasPrefix(value, "pstrain_") {
						continue // e.g. MetricsPath, "/metrics"
					}
					if !listed[value] {
						missing = append(missing, "metrics."+id.Name+" ("+value+")")
					}
				}
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("metricConstants in dashboard_test.go lacks %s", strings.Join(missing, ", "))
	}
}

// TestPanelQueries checks that PanelQueries returns a query for every target
// and leaves no template variable behind.
func TestPanelQueries(t *testing.T) {
	qs, err := PanelQueries(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	d, err := load(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range d.allPanels() {
		n += len(p.Targets)
	}
	if len(qs) != n || n == 0 {
		t.Fatalf("PanelQueries returned %d queries, the dashboard has %d targets", len(qs), n)
	}
	for _, q := range qs {
		if q.Panel == "" || q.RefID == "" || q.Expr == "" || q.Raw == "" {
			t.Errorf("incomplete query %+v", q)
		}
		// Only label_replace's "$1" may remain.
		if rest := strings.ReplaceAll(q.Expr, `"$1"`, ""); strings.Contains(rest, "$") {
			t.Errorf("%s: unsubstituted variable in %s", q, q.Expr)
		}
		if !strings.Contains(q.Expr, `job=~"pstrain"`) {
			t.Errorf("%s: no job=~\"pstrain\" matcher after substitution: %s", q, q.Expr)
		}
	}
}
