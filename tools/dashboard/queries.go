// Package dashboard checks pstrain's Grafana dashboard
// (scripts/grafana/dashboards/pstrain.json) and extracts its queries.
//
// The package is mostly tests: the dashboard is linted with grafana's
// dashboard-linter, its structure is checked, every metric name its queries
// reference is checked against the names exported by
// github.com/pstrain/pstrain/metrics, and, when a Prometheus is available,
// every query is evaluated against it. [PanelQueries] is exported so that
// other integration tests can evaluate the dashboard's queries too.
package dashboard

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
)

// File is the path of the pstrain dashboard, relative to the repository root.
const File = "scripts/grafana/dashboards/pstrain.json"

// Query is one query of a dashboard panel.
type Query struct {
	// Panel is the title of the panel, as written in the dashboard (it may
	// contain template variables, e.g. "Step time share by phase: $worker").
	Panel string
	// RefID is the query's refId within its panel ("A", "B", ...).
	RefID string
	// Raw is the PromQL expression as written in the dashboard, with Grafana
	// template variables.
	Raw string
	// Expr is Raw with the template variables substituted (see
	// [DefaultVariables]), ready for Prometheus' /api/v1/query.
	Expr string
}

// String returns "panel title#refId", the way tests name a query.
func (q Query) String() string { return q.Panel + "#" + q.RefID }

// DefaultVariables returns the values [PanelQueries] substitutes for Grafana
// template variables: the global variables Grafana computes ($__rate_interval
// and friends, with values fit for a run scraped every 2s) and the dashboard's
// own variables, set to select everything scraped by the "pstrain" job of
// scripts/prometheus/prometheus.yml. The map is a fresh copy; callers may
// change it and pass it to [PanelQueriesWith].
func DefaultVariables() map[string]string {
	return map[string]string{
		"__rate_interval": "30s",
		"__interval":      "15s",
		"__interval_ms":   "15000",
		"__range":         "5m",
		"__range_s":       "300",
		"__range_ms":      "300000",
		"job":             "pstrain",
		"instance":        ".*",
		"worker":          ".*",
	}
}

// PanelQueries returns the query of every panel target in the Grafana
// dashboard at path, in dashboard order (panels nested in collapsed rows
// included), with template variables substituted by [DefaultVariables].
func PanelQueries(path string) ([]Query, error) {
	return PanelQueriesWith(path, DefaultVariables())
}

// PanelQueriesWith is [PanelQueries] with the given variable values (names
// without the leading $). A variable the dashboard uses but vars lacks is an
// error.
func PanelQueriesWith(path string, vars map[string]string) ([]Query, error) {
	d, err := load(path)
	if err != nil {
		return nil, err
	}
	var qs []Query
	for _, p := range d.allPanels() {
		for _, t := range p.Targets {
			expr, err := Substitute(t.Expr, vars)
			if err != nil {
				return nil, fmt.Errorf("%s: panel %q query %s: %w", path, p.Title, t.RefID, err)
			}
			qs = append(qs, Query{Panel: p.Title, RefID: t.RefID, Raw: t.Expr, Expr: expr})
		}
	}
	return qs, nil
}

// variableRE matches the three syntaxes of Grafana template variables:
// $name, ${name} or ${name:format}, and the deprecated [[name]] or
// [[name:format]].
var variableRE = regexp.MustCompile(`\$([A-Za-z0-9_]+)|\$\{([^}:]+)(?::[^}]*)?\}|\[\[([^\]:]+)(?::[^\]]*)?\]\]`)

// Substitute replaces the Grafana template variables in expr by their values
// in vars (keyed by name, without the $). Grafana's format suffixes
// (${var:regex}) are accepted and ignored: the values are used as written.
// References whose name starts with a digit, such as the "$1" of a PromQL
// label_replace, are not variables and are left alone. A variable missing
// from vars is an error, so that a new dashboard variable cannot slip through
// unsubstituted.
func Substitute(expr string, vars map[string]string) (string, error) {
	var missing []string
	out := variableRE.ReplaceAllStringFunc(expr, func(m string) string {
		sub := variableRE.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3] // exactly one group matched
		if name == "" || (name[0] >= '0' && name[0] <= '9') {
			return m
		}
		v, ok := vars[name]
		if !ok {
			missing = append(missing, "$"+name)
			return m
		}
		return v
	})
	if len(missing) > 0 {
		sort.Strings(missing)
		return "", fmt.Errorf("no value for template variable(s) %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// dashboardJSON is the part of Grafana's dashboard model this package reads.
type dashboardJSON struct {
	UID           string      `json:"uid"`
	Title         string      `json:"title"`
	SchemaVersion int         `json:"schemaVersion"`
	Editable      bool        `json:"editable"`
	Panels        []panelJSON `json:"panels"`
	Templating    struct {
		List []variableJSON `json:"list"`
	} `json:"templating"`
}

type panelJSON struct {
	ID          int             `json:"id"`
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	Datasource  datasourceRef   `json:"datasource"`
	Repeat      string          `json:"repeat"`
	Panels      []panelJSON     `json:"panels"` // panels of a collapsed row
	Targets     []targetJSON    `json:"targets"`
	FieldConfig json.RawMessage `json:"fieldConfig"`
	Options     json.RawMessage `json:"options"`
}

type targetJSON struct {
	RefID      string         `json:"refId"`
	Expr       string         `json:"expr"`
	Datasource *datasourceRef `json:"datasource"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variableJSON struct {
	Name     string          `json:"name"`
	Label    string          `json:"label"`
	Type     string          `json:"type"`
	Query    json.RawMessage `json:"query"`
	Current  json.RawMessage `json:"current"`
	Multi    bool            `json:"multi"`
	AllValue string          `json:"allValue"`
	Refresh  int             `json:"refresh"`
}

func load(path string) (*dashboardJSON, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d dashboardJSON
	if err := json.Unmarshal(buf, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &d, nil
}

// allPanels returns the dashboard's panels other than rows, in order,
// including those nested in collapsed rows.
func (d *dashboardJSON) allPanels() []panelJSON {
	var out []panelJSON
	var walk func([]panelJSON)
	walk = func(ps []panelJSON) {
		for _, p := range ps {
			if p.Type != "row" {
				out = append(out, p)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}
