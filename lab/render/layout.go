package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"

	"github.com/pstrain/pstrain/tools/dashboard"
)

// The part of Grafana's dashboard model the renderer needs: layout, panel
// type, legend formats, units and a few field overrides. The queries
// themselves come from dashboard.PanelQueriesWith, so that the picture shows
// exactly the PromQL the dashboard's tests check.

type gridPos struct {
	X, Y, W, H int
}

type dashJSON struct {
	Title  string      `json:"title"`
	Panels []panelJSON `json:"panels"`
}

type panelJSON struct {
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	GridPos     gridPos      `json:"gridPos"`
	Repeat      string       `json:"repeat"`
	Panels      []panelJSON  `json:"panels"`
	Targets     []targetJSON `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit   string   `json:"unit"`
			Min    *float64 `json:"min"`
			Max    *float64 `json:"max"`
			Custom struct {
				AxisLabel   string `json:"axisLabel"`
				FillOpacity float64
				LineWidth   float64 `json:"lineWidth"`
				Stacking    struct {
					Mode string `json:"mode"`
				} `json:"stacking"`
			} `json:"custom"`
		} `json:"defaults"`
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options string `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string          `json:"id"`
				Value json.RawMessage `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	Options struct {
		Legend struct {
			Calcs []string `json:"calcs"`
		} `json:"legend"`
		YAxis struct {
			AxisLabel string `json:"axisLabel"`
		} `json:"yAxis"`
		RowsFrame struct {
			Value string `json:"value"`
		} `json:"rowsFrame"`
	} `json:"options"`
}

type targetJSON struct {
	RefID        string `json:"refId"`
	LegendFormat string `json:"legendFormat"`
	Hide         bool   `json:"hide"`
}

// Panel is one panel of the picture, with its queries resolved.
type Panel struct {
	Type      string // "timeseries", "stat", "heatmap", ... ("row" for row titles)
	Title     string // with template variables substituted
	Grid      gridPos
	Unit      string
	Min       *float64
	Max       *float64
	Axis      string // y axis label
	Fill      float64
	Width     float64 // line width
	Stacked   bool
	ShowLast  bool   // the legend shows each series' last value
	HeatValue string // heatmap: what the cells count ("gradients/s")
	Queries   []PanelQuery
	Over      []override
}

// PanelQuery is one query of a panel.
type PanelQuery struct {
	dashboard.Query
	Legend string // legendFormat, e.g. "{{task}} sent"
}

// override is a byRegexp field override, reduced to what the renderer draws.
type override struct {
	re        *regexp.Regexp
	negativeY bool
	dashed    bool
	width     float64 // 0: unchanged
	fill      *float64
}

// style is how one series is drawn after the overrides.
type style struct {
	negativeY bool
	dashed    bool
	width     float64
	fill      float64
}

func (p *Panel) styleFor(name string) style {
	s := style{width: p.Width, fill: p.Fill}
	if s.width == 0 {
		s.width = 1
	}
	for _, o := range p.Over {
		if !o.re.MatchString(name) {
			continue
		}
		s.negativeY = s.negativeY || o.negativeY
		s.dashed = s.dashed || o.dashed
		if o.width > 0 {
			s.width = o.width
		}
		if o.fill != nil {
			s.fill = *o.fill
		}
	}
	return s
}

// Dashboard is the dashboard to draw: its title and its panels and rows in
// order.
type Dashboard struct {
	Title  string
	Panels []Panel
}

// Rows returns the number of grid rows the dashboard spans.
func (d *Dashboard) Rows() int {
	n := 0
	for _, p := range d.Panels {
		n = max(n, p.Grid.Y+p.Grid.H)
	}
	return n
}

// loadDashboard reads the dashboard at path and joins its panels with their
// queries from dashboard.PanelQueriesWith(path, vars). titleVars are the
// values shown in titles (e.g. "All" for a variable set to ".*").
func loadDashboard(path string, vars, titleVars map[string]string) (*Dashboard, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d dashJSON
	if err := json.Unmarshal(buf, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	qs, err := dashboard.PanelQueriesWith(path, vars)
	if err != nil {
		return nil, err
	}
	out := &Dashboard{Title: d.Title}
	next := 0 // index in qs: PanelQueriesWith walks the panels in the same order
	var walk func([]panelJSON) error
	walk = func(ps []panelJSON) error {
		for _, pj := range ps {
			title, err := dashboard.Substitute(pj.Title, titleVars)
			if err != nil {
				title = pj.Title
			}
			p := Panel{Type: pj.Type, Title: title, Grid: pj.GridPos}
			if pj.Type != "row" {
				dc := pj.FieldConfig.Defaults
				p.Unit, p.Min, p.Max = dc.Unit, dc.Min, dc.Max
				p.Axis = dc.Custom.AxisLabel
				if p.Axis == "" {
					p.Axis = pj.Options.YAxis.AxisLabel
				}
				p.Fill, p.Width = dc.Custom.FillOpacity, dc.Custom.LineWidth
				p.Stacked = dc.Custom.Stacking.Mode == "normal"
				p.HeatValue = pj.Options.RowsFrame.Value
				for _, c := range pj.Options.Legend.Calcs {
					if c == "lastNotNull" || c == "last" {
						p.ShowLast = true
					}
				}
				for _, o := range pj.FieldConfig.Overrides {
					if o.Matcher.ID != "byRegexp" && o.Matcher.ID != "byName" {
						continue
					}
					pat := o.Matcher.Options
					if o.Matcher.ID == "byName" {
						pat = regexp.QuoteMeta(pat)
					}
					re, err := regexp.Compile("^(?:" + pat + ")$")
					if err != nil {
						continue
					}
					ov := override{re: re}
					for _, prop := range o.Properties {
						switch prop.ID {
						case "custom.transform":
							var v string
							_ = json.Unmarshal(prop.Value, &v)
							ov.negativeY = v == "negative-Y"
						case "custom.lineStyle":
							var v struct {
								Fill string `json:"fill"`
							}
							_ = json.Unmarshal(prop.Value, &v)
							ov.dashed = v.Fill == "dash" || v.Fill == "dot"
						case "custom.lineWidth":
							_ = json.Unmarshal(prop.Value, &ov.width)
						case "custom.fillOpacity":
							var f float64
							if json.Unmarshal(prop.Value, &f) == nil {
								ov.fill = &f
							}
						}
					}
					p.Over = append(p.Over, ov)
				}
				for _, t := range pj.Targets {
					if next >= len(qs) || qs[next].Panel != pj.Title || qs[next].RefID != t.RefID {
						return fmt.Errorf("%s: panel %q query %s does not line up with dashboard.PanelQueriesWith", path, pj.Title, t.RefID)
					}
					q := qs[next]
					next++
					if t.Hide {
						continue
					}
					p.Queries = append(p.Queries, PanelQuery{Query: q, Legend: t.LegendFormat})
				}
			}
			out.Panels = append(out.Panels, p)
			if err := walk(pj.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	if next != len(qs) {
		return nil, fmt.Errorf("%s: %d queries not matched to a panel", path, len(qs)-next)
	}
	return out, nil
}
