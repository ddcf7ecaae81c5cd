package figures

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/pstrain/pstrain/observe/report"
	"github.com/pstrain/pstrain/tools/sweep"
)

// Plot size: small enough to commit, large enough to read.
const (
	width  = 7 * vg.Inch
	height = 4.5 * vg.Inch
)

// newPlot builds the gonum plot of f.
func newPlot(f Figure) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = f.Title
	p.X.Label.Text = f.XLabel
	p.Y.Label.Text = f.YLabel
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	for i, s := range f.Series {
		if len(s.X) != len(s.Y) {
			return nil, fmt.Errorf("figures: %s: series %q has %d x and %d y values", f.Name, s.Label, len(s.X), len(s.Y))
		}
		xys := make(plotter.XYs, len(s.X))
		for j := range s.X {
			xys[j].X, xys[j].Y = s.X[j], s.Y[j]
		}
		sc, err := plotter.NewScatter(xys)
		if err != nil {
			return nil, fmt.Errorf("figures: %s: series %q: %w", f.Name, s.Label, err)
		}
		sc.GlyphStyle.Color = plotutil.Color(i)
		sc.GlyphStyle.Shape = plotutil.Shape(i)
		sc.GlyphStyle.Radius = vg.Points(2.5)
		var thumb []plot.Thumbnailer
		if s.Kind == Line {
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, fmt.Errorf("figures: %s: series %q: %w", f.Name, s.Label, err)
			}
			l.LineStyle.Color = plotutil.Color(i)
			l.LineStyle.Width = vg.Points(1.2)
			l.LineStyle.Dashes = plotutil.Dashes(i / len(plotutil.SoftColors))
			p.Add(l)
			thumb = append(thumb, l)
		}
		p.Add(sc)
		thumb = append(thumb, sc)
		p.Legend.Add(s.Label, thumb...)
	}
	return p, nil
}

// Render draws f into dir as NAME.png and NAME.svg.
func Render(f Figure, dir string) error {
	return render(f, dir, ".png", ".svg")
}

// render draws f into dir in the formats given by file extension.
func render(f Figure, dir string, exts ...string) error {
	p, err := newPlot(f)
	if err != nil {
		return err
	}
	for _, ext := range exts {
		if err := p.Save(width, height, filepath.Join(dir, f.Name+ext)); err != nil {
			return fmt.Errorf("figures: %s%s: %w", f.Name, ext, err)
		}
	}
	return nil
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
