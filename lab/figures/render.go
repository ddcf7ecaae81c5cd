package figures

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/pstrain/pstrain/lab/sweep"
	"github.com/pstrain/pstrain/observe/report"
)

// Plot size: small enough to commit, large enough to read. The legend is
// drawn to the right of the plot, outside the data area, in a strip as wide
// as its longest entry; the plot area keeps width x height.
const (
	width     = 7 * vg.Inch
	height    = 4.5 * vg.Inch
	legendPad = 0.15 * vg.Inch
)

// whiskers are the points of a series with their min-max range, as
// plotter.YErrorBars wants them (relative to Y).
type whiskers struct {
	plotter.XYs
	lo, hi []float64
}

func (w whiskers) YError(i int) (float64, float64) { return w.XYs[i].Y - w.lo[i], w.hi[i] - w.XYs[i].Y }

// newPlot builds the gonum plot of f, and its legend, drawn apart.
func newPlot(f Figure) (*plot.Plot, plot.Legend, error) {
	p := plot.New()
	p.Title.Text = f.Title
	p.X.Label.Text = f.XLabel
	p.Y.Label.Text = f.YLabel
	p.Add(plotter.NewGrid())
	legend := plot.NewLegend()
	legend.Top = true
	legend.Left = true
	if len(f.XTicks) > 0 {
		ticks := make([]plot.Tick, len(f.XTicks))
		for i, l := range f.XTicks {
			ticks[i] = plot.Tick{Value: float64(i), Label: l}
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.X.Min, p.X.Max = -0.5, float64(len(f.XTicks))-0.5
		if len(f.XTicks) > 3 || longest(f.XTicks) > 12 {
			p.X.Tick.Label.Rotation = math.Pi / 6
			p.X.Tick.Label.XAlign = draw.XRight
			p.X.Tick.Label.YAlign = draw.YTop
		}
	}
	if f.YFromZero {
		p.Y.Min = 0
	}
	dodge := dodgeStep(f)
	var below *plotter.BarChart
	for i, s := range f.Series {
		if len(s.X) != len(s.Y) {
			return nil, legend, fmt.Errorf("figures: %s: series %q has %d x and %d y values", f.Name, s.Label, len(s.X), len(s.Y))
		}
		if s.YLo != nil && (len(s.YLo) != len(s.Y) || len(s.YHi) != len(s.Y)) {
			return nil, legend, fmt.Errorf("figures: %s: series %q: whiskers do not match its points", f.Name, s.Label)
		}
		xys := make(plotter.XYs, len(s.X))
		for j := range s.X {
			xys[j].X, xys[j].Y = s.X[j], s.Y[j]
			if s.YLo != nil {
				xys[j].X += dodge * (float64(i) - float64(len(f.Series)-1)/2)
			}
		}
		if s.Kind == Bars {
			b, err := barSeries(f, s, below)
			if err != nil {
				return nil, legend, err
			}
			b.Color = plotutil.Color(i)
			p.Add(b)
			legend.Add(s.Label, b)
			below = b
			continue
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, legend, fmt.Errorf("figures: %s: series %q: %w", f.Name, s.Label, err)
		}
		sc.GlyphStyle.Color = plotutil.Color(i)
		sc.GlyphStyle.Shape = plotutil.Shape(i)
		sc.GlyphStyle.Radius = vg.Points(2.5)
		var thumb []plot.Thumbnailer
		if s.Kind == Line {
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, legend, fmt.Errorf("figures: %s: series %q: %w", f.Name, s.Label, err)
			}
			l.LineStyle.Color = plotutil.Color(i)
			l.LineStyle.Width = vg.Points(1.2)
			l.LineStyle.Dashes = plotutil.Dashes(i / len(plotutil.SoftColors))
			p.Add(l)
			thumb = append(thumb, l)
		}
		if s.YLo != nil {
			eb, err := plotter.NewYErrorBars(whiskers{xys, s.YLo, s.YHi})
			if err != nil {
				return nil, legend, fmt.Errorf("figures: %s: series %q: %w", f.Name, s.Label, err)
			}
			eb.LineStyle.Color = plotutil.Color(i)
			p.Add(eb)
		}
		p.Add(sc)
		thumb = append(thumb, sc)
		legend.Add(s.Label, thumb...)
	}
	return p, legend, nil
}

// dodgeStep is how far apart, in x units, the series of a figure with
// whiskers are drawn so that whiskers at the same x do not cover each
// other: 1.5% of the x range (0.08 of a category), 0 with one series.
func dodgeStep(f Figure) float64 {
	if len(f.Series) < 2 {
		return 0
	}
	if len(f.XTicks) > 0 {
		return 0.08
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range f.Series {
		for _, x := range s.X {
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	if !(hi > lo) {
		return 0
	}
	return 0.015 * (hi - lo)
}

// barSeries is a Bars series as a bar chart over the categorical x axis,
// stacked on below.
func barSeries(f Figure, s Series, below *plotter.BarChart) (*plotter.BarChart, error) {
	n := max(len(f.XTicks), len(s.X))
	vals := make(plotter.Values, n)
	for j, x := range s.X {
		if i := int(x); i >= 0 && i < n {
			vals[i] = s.Y[j]
		}
	}
	b, err := plotter.NewBarChart(vals, vg.Points(min(40, 300/float64(max(n, 1)))))
	if err != nil {
		return nil, fmt.Errorf("figures: %s: series %q: %w", f.Name, s.Label, err)
	}
	b.LineStyle.Width = 0
	if below != nil {
		b.StackOn(below)
	}
	return b, nil
}

func longest(ls []string) int {
	n := 0
	for _, l := range ls {
		n = max(n, len(l))
	}
	return n
}

// Render draws f into dir as NAME.png and NAME.svg.
func Render(f Figure, dir string) error {
	return render(f, dir, ".png", ".svg")
}

// render draws f into dir in the formats given by file extension: the plot
// on the left, the legend in a strip to its right.
func render(f Figure, dir string, exts ...string) error {
	p, legend, err := newPlot(f)
	if err != nil {
		return err
	}
	for _, ext := range exts {
		if err := save(p, legend, filepath.Join(dir, f.Name+ext), ext[1:]); err != nil {
			return fmt.Errorf("figures: %s%s: %w", f.Name, ext, err)
		}
	}
	return nil
}

// save writes the plot and its legend to path in format (png, svg).
func save(p *plot.Plot, legend plot.Legend, path, format string) error {
	probe := draw.New(vgimg.New(width, height))
	lw := legend.Rectangle(probe).Max.X - legend.Rectangle(probe).Min.X
	strip := vg.Length(0)
	if lw > 0 {
		strip = lw + 2*legendPad
	}
	c, err := draw.NewFormattedCanvas(width+strip, height, format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	p.Draw(draw.Crop(dc, 0, -strip, 0, 0))
	if strip > 0 {
		legend.Draw(draw.Crop(dc, width+legendPad, -legendPad, legendPad, -legendPad))
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Load reads a sweep directory: results.csv and, for every finished run,
// its report's evaluations and its samples (a run missing either is drawn
// without them).
func Load(dir string) (Input, error) {
	rows, err := sweep.ReadResults(dir)
	if err != nil {
		return Input{}, fmt.Errorf("figures: %w", err)
	}
	in := Input{Rows: rows, Evals: map[string][]report.Eval{}, Samples: map[string][]sweep.Sample{}}
	for _, r := range rows {
		if r.Status != sweep.StatusOK {
			continue
		}
		if rep, err := sweep.ReadRunReport(dir, r.RunID); err == nil {
			in.Evals[r.RunID] = rep.Evals
		} else if !errors.Is(err, os.ErrNotExist) {
			return Input{}, fmt.Errorf("figures: %w", err)
		}
		if s, err := sweep.ReadRunSamples(dir, r.RunID); err == nil {
			in.Samples[r.RunID] = s
		} else if !errors.Is(err, os.ErrNotExist) {
			return Input{}, fmt.Errorf("figures: %w", err)
		}
	}
	return in, nil
}

// DrawAll (re)draws every figure of the sweep in dir: the sweep-level ones
// (Build) into dir as PNG and SVG, and each run's memory per process into
// runs/ID/memory.png (PNG only, to keep committed results small). It returns
// the sweep-level figures drawn.
func DrawAll(dir string) ([]Figure, error) {
	in, err := Load(dir)
	if err != nil {
		return nil, err
	}
	figs := Build(in)
	for _, f := range figs {
		if err := Render(f, dir); err != nil {
			return nil, err
		}
	}
	for id, s := range in.Samples {
		if f := RunMemory(id, s); len(f.Series) > 0 {
			if err := render(f, sweep.RunDir(dir, id), ".png"); err != nil {
				return nil, err
			}
		}
	}
	return figs, nil
}
