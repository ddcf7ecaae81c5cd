package main

import (
	"fmt"
	"image"
	"image/color"
	stddraw "image/draw"
	"image/png"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The picture is drawn at 72 dpi, so that one vg point is one pixel.
const dpi = 72

// Geometry of the picture, in pixels.
const (
	pad      = 12.0 // outer margin
	headerH  = 58.0 // dashboard title and range
	unitH    = 30.0 // one row of Grafana's grid
	gap      = 8.0  // between panels
	titleH   = 26.0 // panel title strip
	legendLH = 15.0 // legend line height
)

// Theme: Grafana's dark theme, roughly.
var (
	colBG     = rgb(0x111217)
	colPanel  = rgb(0x181b1f)
	colBorder = rgb(0x2c2f35)
	colText   = rgb(0xd8d9e3)
	colDim    = rgb(0x8e909b)
	colGrid   = rgb(0x26292e)
	colErr    = rgb(0xf2495c)
	colHeat   = rgb(0xff9830)
	palette   = []color.Color{ // Grafana's classic palette
		rgb(0x7eb26d), rgb(0xeab839), rgb(0x6ed0e0), rgb(0xef843c), rgb(0xe24d42),
		rgb(0x1f78c1), rgb(0xba43a6), rgb(0x705da0), rgb(0x508642), rgb(0xcca300),
		rgb(0x447ebc), rgb(0xc15c17), rgb(0x890f02), rgb(0x0a437c), rgb(0x6d1f62),
		rgb(0x584477), rgb(0xb7dbab), rgb(0xf4d598), rgb(0x70dbed), rgb(0xf9ba8f),
	}
)

func rgb(v uint32) color.NRGBA {
	return color.NRGBA{R: uint8(v >> 16), G: uint8(v >> 8), B: uint8(v), A: 0xff}
}

func withAlpha(c color.Color, a float64) color.Color {
	n := color.NRGBAModel.Convert(c).(color.NRGBA)
	n.A = uint8(math.Round(255 * math.Max(0, math.Min(1, a))))
	return n
}

// mix returns a*(1-f) + b*f.
func mix(a, b color.Color, f float64) color.Color {
	x := color.NRGBAModel.Convert(a).(color.NRGBA)
	y := color.NRGBAModel.Convert(b).(color.NRGBA)
	l := func(p, q uint8) uint8 { return uint8(math.Round(float64(p)*(1-f) + float64(q)*f)) }
	return color.NRGBA{R: l(x.R, y.R), G: l(x.G, y.G), B: l(x.B, y.B), A: 0xff}
}

var (
	sans     = font.Font{Typeface: "Liberation", Variant: "Sans"}
	sansBold = font.Font{Typeface: "Liberation", Variant: "Sans", Weight: 700}
)

func textStyle(f font.Font, size float64, c color.Color) text.Style {
	return text.Style{Color: c, Font: font.From(f, font.Length(size)), Handler: plot.DefaultTextHandler, YAlign: draw.YTop}
}

// pictureSize returns the size in pixels of the picture of a dashboard
// spanning rows grid rows.
func pictureSize(width, rows int) (int, int) {
	return width, int(math.Ceil(headerH + float64(rows)*unitH + pad))
}

// drawDashboard draws the dashboard with its query results.
func drawDashboard(d *Dashboard, data []*panelData, o *options) image.Image {
	W, H := pictureSize(o.width, d.Rows())
	c := vgimg.NewWith(vgimg.UseWH(vg.Length(W), vg.Length(H)), vgimg.UseDPI(dpi), vgimg.UseBackgroundColor(colBG))
	dc := draw.New(c)
	w, h := float64(W), float64(H)

	// Header: title, range and variables.
	dc.FillText(textStyle(sansBold, 22, colText), vg.Point{X: vg.Length(pad), Y: vg.Length(h - pad)}, d.Title)
	tv := titleVars(o.vars)
	sub := fmt.Sprintf("%s – %s UTC  ·  step %s  ·  $__rate_interval %s  ·  job %s  ·  instance %s  ·  worker %s",
		o.start.UTC().Format("2006-01-02 15:04:05"), o.end.UTC().Format("15:04:05"), o.step, o.vars["__rate_interval"],
		tv["job"], tv["instance"], tv["worker"])
	dc.FillText(textStyle(sans, 12, colDim), vg.Point{X: vg.Length(pad), Y: vg.Length(h - pad - 28)}, sub)
	note := textStyle(sans, 11, colDim)
	note.XAlign = draw.XRight
	dc.FillText(note, vg.Point{X: vg.Length(w - pad), Y: vg.Length(h - pad - 4)}, "drawn by lab/render from Prometheus query_range results")
	dc.FillText(note, vg.Point{X: vg.Length(w - pad), Y: vg.Length(h - pad - 20)}, "pstrain's own rendering of the dashboard's panels and queries, not a Grafana screenshot")

	colW := (w - 2*pad + gap) / 24
	for _, pd := range data {
		g := pd.Grid
		x0 := pad + float64(g.X)*colW
		x1 := x0 + float64(g.W)*colW - gap
		top := headerH + float64(g.Y)*unitH      // from the picture's top
		bottom := top + float64(g.H)*unitH - gap // from the picture's top
		region := draw.Crop(dc, vg.Length(x0), vg.Length(x1-w), vg.Length(h-bottom), vg.Length(-top))
		if pd.Type == "row" {
			drawRow(region, pd.Title)
			continue
		}
		drawPanel(region, pd, o)
	}
	return c.Image()
}

func drawRow(c draw.Canvas, title string) {
	st := textStyle(sansBold, 15, colText)
	st.YAlign = draw.YCenter
	mid := (c.Min.Y + c.Max.Y) / 2
	c.FillText(st, vg.Point{X: c.Min.X + 2, Y: mid}, title)
	tw := st.Width(title)
	c.StrokeLine2(draw.LineStyle{Color: colBorder, Width: 1}, c.Min.X+tw+14, mid, c.Max.X, mid)
}

func fillRect(c draw.Canvas, r vg.Rectangle, col color.Color) {
	c.SetColor(col)
	c.Fill(r.Path())
}

// legendEntry is one item of a panel's legend.
type legendEntry struct {
	name, value string
	col         color.Color
	dashed      bool
}

// drawSeries is a series ready to draw.
type drawSeries struct {
	name  string
	col   color.Color
	sty   style
	t, y  []float64 // y after stacking and negative-Y
	base  []float64 // the stack below (nil: the zero line)
	last  float64   // last non-NaN raw value
	order int
}

func drawPanel(c draw.Canvas, pd *panelData, o *options) {
	fillRect(c, c.Rectangle, colPanel)
	c.SetLineStyle(draw.LineStyle{Color: colBorder, Width: 1})
	c.Stroke(c.Rectangle.Path())

	st := textStyle(sansBold, 13, colText)
	c.FillText(st, vg.Point{X: c.Min.X + 9, Y: c.Max.Y - 8}, pd.Title)
	body := draw.Crop(c, 4, -10, 6, -titleH)

	if len(pd.errs) > 0 {
		es := textStyle(sans, 10, colErr)
		es.XAlign = draw.XRight
		msg := "query error: " + pd.errs[0]
		if len(msg) > 70 {
			msg = msg[:69] + "…"
		}
		c.FillText(es, vg.Point{X: c.Max.X - 8, Y: c.Max.Y - 10}, msg)
	}
	switch pd.Type {
	case "heatmap":
		drawHeatmap(body, pd, o)
	case "stat":
		drawStat(body, pd, o)
	default:
		drawTimeseries(body, pd, o)
	}
}

func noData(c draw.Canvas) {
	st := textStyle(sans, 14, colDim)
	st.XAlign, st.YAlign = draw.XCenter, draw.YCenter
	c.FillText(st, c.Center(), "No data")
}

// collect turns a panel's results into named series, in legend order.
func collect(pd *panelData) []drawSeries {
	var out []drawSeries
	for qi, res := range pd.results {
		var ss []drawSeries
		for _, s := range res {
			name := legendName(pd.Queries[qi].Legend, s.Labels)
			ds := drawSeries{name: name, t: s.T, y: append([]float64(nil), s.V...), last: math.NaN()}
			for i := len(s.V) - 1; i >= 0; i-- {
				if !math.IsNaN(s.V[i]) {
					ds.last = s.V[i]
					break
				}
			}
			ss = append(ss, ds)
		}
		sort.SliceStable(ss, func(i, j int) bool { return naturalLess(ss[i].name, ss[j].name) })
		out = append(out, ss...)
	}
	for i := range out {
		out[i].order = i
		out[i].col = palette[i%len(palette)]
		out[i].sty = pd.styleFor(out[i].name)
	}
	return out
}

// naturalLess compares strings with embedded numbers numerically
// ("worker/2" < "worker/10").
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitsPrefix(a), digitsPrefix(b)
		if da > 0 && db > 0 {
			na, _ := strconv.Atoi(a[:da])
			nb, _ := strconv.Atoi(b[:db])
			if na != nb {
				return na < nb
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitsPrefix(s string) int {
	i := 0
	for i < len(s) && i < 18 && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

func drawTimeseries(body draw.Canvas, pd *panelData, o *options) {
	series := collect(pd)
	// Stacking (on aligned timestamps) and the negative-Y transform.
	cum := map[int64]float64{}
	for i := range series {
		s := &series[i]
		if s.sty.negativeY {
			for j := range s.y {
				s.y[j] = -s.y[j]
			}
		}
		if pd.Stacked {
			s.base = make([]float64, len(s.y))
			for j, t := range s.t {
				k := int64(math.Round(t * 1000))
				s.base[j] = cum[k]
				if !math.IsNaN(s.y[j]) {
					s.y[j] += cum[k]
					cum[k] = s.y[j]
				}
			}
		}
	}
	var entries []legendEntry
	for _, s := range series {
		e := legendEntry{name: s.name, col: s.col, dashed: s.sty.dashed}
		if pd.ShowLast {
			e.value = formatValue(pd.Unit, s.last, s.last, 0)
		}
		entries = append(entries, e)
	}
	legendH := drawLegend(body, entries, 3)
	area := draw.Crop(body, 0, 0, vg.Length(legendH), 0)

	lo, hi := math.Inf(1), math.Inf(-1)
	anyNeg := false
	for _, s := range series {
		anyNeg = anyNeg || s.sty.negativeY
		for _, v := range s.y {
			if !math.IsNaN(v) {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		noData(area)
		return
	}
	if pd.Min != nil && !anyNeg {
		lo = *pd.Min
	}
	if pd.Max != nil {
		hi = *pd.Max
	}
	if anyNeg {
		hi = math.Max(hi, 0)
		lo = math.Min(lo, 0)
	}
	if hi-lo < 1e-12*math.Max(1, math.Abs(hi)) {
		if hi == 0 {
			hi = 1
		} else {
			lo, hi = math.Min(0, lo*0.9), math.Max(0, hi*1.1)
		}
	}
	nTicks := max(2, int(float64(area.Max.Y-area.Min.Y)/38))
	step := niceStepFor(pd.Unit, hi-lo, nTicks)
	if pd.Min == nil || anyNeg {
		lo = math.Floor(lo/step+1e-9) * step
	}
	if pd.Max == nil {
		hi = math.Ceil(hi/step-1e-9) * step
	}

	p := newPlot(area, o)
	p.Y.Min, p.Y.Max = lo, hi
	p.Y.Tick.Marker = yTicks{unit: pd.Unit, step: step, abs: anyNeg}
	p.Y.Label.Text = pd.Axis
	gap := 1.5 * o.step.Seconds()
	for _, s := range series {
		p.Add(&linePlot{s: s, gap: gap})
	}
	p.Draw(area)
}

// newPlot returns a gonum plot themed for a panel body.
func newPlot(area draw.Canvas, o *options) *plot.Plot {
	p := plot.New()
	p.BackgroundColor = color.Transparent
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.LineStyle.Width = 0
		a.Tick.LineStyle.Width = 0
		a.Tick.Length = 0
		a.Tick.Label = textStyle(sans, 10, colDim)
		a.Label.TextStyle.Color = colDim
		a.Label.TextStyle.Font = font.From(sans, 10)
		a.Padding = 4
		a.Label.Padding = 2
	}
	p.X.Tick.Label.XAlign = draw.XCenter
	p.Y.Tick.Label.XAlign = draw.XRight
	p.Y.Tick.Label.YAlign = draw.YCenter
	p.X.Min, p.X.Max = float64(o.start.UnixMilli())/1e3, float64(o.end.UnixMilli())/1e3
	p.X.Tick.Marker = timeTicks{n: max(2, int(float64(area.Max.X-area.Min.X)/95)), loc: time.UTC}
	grid := plotter.NewGrid()
	grid.Vertical = draw.LineStyle{Color: colGrid, Width: 1}
	grid.Horizontal = draw.LineStyle{Color: colGrid, Width: 1}
	p.Add(grid)
	return p
}

// linePlot draws one series: its fill, then its line, broken at NaNs and
// missing steps.
type linePlot struct {
	s   drawSeries
	gap float64 // a longer time between samples is a hole
}

func (l *linePlot) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	s := l.s
	baseAt := func(j int) float64 {
		if s.base != nil {
			return s.base[j]
		}
		return math.Max(p.Y.Min, math.Min(p.Y.Max, 0))
	}
	ls := draw.LineStyle{Color: s.col, Width: vg.Length(s.sty.width)}
	if s.sty.dashed {
		ls.Dashes = []vg.Length{6, 4}
	}
	fill := s.sty.fill / 100
	if s.base != nil && fill == 0 {
		fill = 0.5
	}
	flush := func(idx []int) {
		if len(idx) == 0 {
			return
		}
		pts := make([]vg.Point, len(idx))
		for k, j := range idx {
			pts[k] = vg.Point{X: trX(s.t[j]), Y: trY(s.y[j])}
		}
		if len(idx) == 1 {
			c.DrawGlyph(draw.GlyphStyle{Color: s.col, Radius: 1.5, Shape: draw.CircleGlyph{}}, pts[0])
			return
		}
		if fill > 0 {
			poly := append([]vg.Point(nil), pts...)
			for k := len(idx) - 1; k >= 0; k-- {
				poly = append(poly, vg.Point{X: trX(s.t[idx[k]]), Y: trY(baseAt(idx[k]))})
			}
			c.FillPolygon(withAlpha(s.col, fill), c.ClipPolygonXY(poly))
		}
		c.StrokeLines(ls, c.ClipLinesXY(pts)...)
	}
	var seg []int
	for j := range s.t {
		if math.IsNaN(s.y[j]) || (len(seg) > 0 && s.t[j]-s.t[seg[len(seg)-1]] > l.gap) {
			flush(seg)
			seg = seg[:0]
		}
		if !math.IsNaN(s.y[j]) {
			seg = append(seg, j)
		}
	}
	flush(seg)
}

// drawLegend draws entries along the bottom of c, in at most maxLines lines,
// and returns the height it took.
func drawLegend(c draw.Canvas, entries []legendEntry, maxLines int) float64 {
	if len(entries) == 0 {
		return 0
	}
	nameSt := textStyle(sans, 11, colText)
	valSt := textStyle(sans, 11, colDim)
	nameSt.YAlign, valSt.YAlign = draw.YCenter, draw.YCenter
	const swatch, sp = 14.0, 18.0
	width := float64(c.Max.X-c.Min.X) - 4
	type placed struct {
		e legendEntry
		x float64
	}
	var lines [][]placed
	x := width + 1 // forces a first line
	itemW := func(e legendEntry) float64 {
		w := swatch + 5 + float64(nameSt.Width(e.name))
		if e.value != "" {
			w += 6 + float64(valSt.Width(e.value))
		}
		return w
	}
	for _, e := range entries {
		iw := itemW(e)
		if x+iw > width && (len(lines) == 0 || len(lines[len(lines)-1]) > 0) {
			lines = append(lines, nil)
			x = 0
		}
		lines[len(lines)-1] = append(lines[len(lines)-1], placed{e, x})
		x += iw + sp
	}
	more := 0
	if len(lines) > maxLines {
		for _, l := range lines[maxLines:] {
			more += len(l)
		}
		lines = lines[:maxLines]
		// Make room for "+N more" at the end of the last line.
		last := lines[maxLines-1]
		label := fmt.Sprintf("+%d more", more)
		for len(last) > 1 && last[len(last)-1].x+itemW(last[len(last)-1].e)+sp+float64(valSt.Width(label)) > width {
			last = last[:len(last)-1]
			more++
		}
		lines[maxLines-1] = last
	}
	h := float64(len(lines))*legendLH + 4
	for li, l := range lines {
		y := c.Min.Y + vg.Length(h-4-(float64(li)+0.5)*legendLH)
		var end float64
		for _, pl := range l {
			x0 := c.Min.X + 4 + vg.Length(pl.x)
			ls := draw.LineStyle{Color: pl.e.col, Width: 3}
			if pl.e.dashed {
				ls.Dashes = []vg.Length{4, 2}
			}
			c.StrokeLine2(ls, x0, y, x0+swatch, y)
			c.FillText(nameSt, vg.Point{X: x0 + swatch + 5, Y: y}, pl.e.name)
			if pl.e.value != "" {
				c.FillText(valSt, vg.Point{X: x0 + swatch + 5 + nameSt.Width(pl.e.name) + 6, Y: y}, pl.e.value)
			}
			end = pl.x + itemW(pl.e) + sp
		}
		if li == len(lines)-1 && more > 0 {
			c.FillText(valSt, vg.Point{X: c.Min.X + 4 + vg.Length(end), Y: y}, fmt.Sprintf("+%d more", more))
		}
	}
	return h
}

// drawStat draws the last value of the panel's first series in big text.
func drawStat(body draw.Canvas, pd *panelData, o *options) {
	series := collect(pd)
	if len(series) == 0 || math.IsNaN(series[0].last) {
		noData(body)
		return
	}
	s := series[0]
	st := textStyle(sansBold, 40, s.col)
	st.XAlign, st.YAlign = draw.XCenter, draw.YCenter
	body.FillText(st, body.Center(), formatValue(pd.Unit, s.last, s.last, 0))
	if len(series) > 1 || s.name != "" {
		ns := textStyle(sans, 11, colDim)
		ns.XAlign = draw.XCenter
		ns.YAlign = draw.YBottom
		body.FillText(ns, vg.Point{X: body.Center().X, Y: body.Min.Y + 4}, s.name)
	}
}

// drawHeatmap draws a Prometheus histogram (series by "le", cumulative) as
// Grafana's heatmap does with format "heatmap": one row per bucket, one
// column per step, the colour the bucket's own rate.
func drawHeatmap(body draw.Canvas, pd *panelData, o *options) {
	type bucket struct {
		le    float64
		label string
		byT   map[int64]float64
	}
	var bs []*bucket
	times := map[int64]bool{}
	for _, res := range pd.results {
		for _, s := range res {
			lbl := s.Labels["le"]
			le, err := strconv.ParseFloat(lbl, 64)
			if err != nil {
				continue
			}
			b := &bucket{le: le, label: lbl, byT: map[int64]float64{}}
			for j, t := range s.T {
				k := int64(math.Round(t * 1000))
				times[k] = true
				if !math.IsNaN(s.V[j]) {
					b.byT[k] += s.V[j]
				}
			}
			bs = append(bs, b)
		}
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	var ts []int64
	for t := range times {
		ts = append(ts, t)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	// De-accumulate: each bucket's own rate.
	z := make([][]float64, len(bs))
	zmax := 0.0
	for i, b := range bs {
		z[i] = make([]float64, len(ts))
		for j, t := range ts {
			v := b.byT[t]
			if i > 0 {
				v -= bs[i-1].byT[t]
			}
			z[i][j] = math.Max(0, v)
			zmax = math.Max(zmax, z[i][j])
		}
	}
	legendH := 0.0
	if zmax > 0 {
		legendH = drawColorScale(body, zmax, pd.HeatValue)
	}
	area := draw.Crop(body, 0, 0, vg.Length(legendH), 0)
	if len(bs) == 0 || zmax == 0 {
		noData(area)
		return
	}
	p := newPlot(area, o)
	p.Y.Min, p.Y.Max = 0, float64(len(bs))
	rowH := float64(area.Max.Y-area.Min.Y) / float64(len(bs))
	every := max(1, int(math.Ceil(14/rowH)))
	var ticks []plot.Tick
	for i, b := range bs {
		if i%every == 0 {
			ticks = append(ticks, plot.Tick{Value: float64(i) + 0.5, Label: b.label})
		}
	}
	p.Y.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Label.Text = pd.Axis
	tsec := make([]float64, len(ts))
	for j, t := range ts {
		tsec[j] = float64(t) / 1e3
	}
	p.Add(&heatPlot{t: tsec, z: z, zmax: zmax, step: o.step.Seconds()})
	p.Draw(area)
}

// heatColor maps v in [0, zmax] to the heatmap colour (exponential scale,
// exponent 0.5, like the dashboard's "Oranges" scheme).
func heatColor(v, zmax float64) color.Color {
	f := math.Sqrt(v / zmax)
	return mix(rgb(0x3a2210), colHeat, f)
}

type heatPlot struct {
	t    []float64
	z    [][]float64
	zmax float64
	step float64
}

func (h *heatPlot) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	for i, row := range h.z {
		for j, v := range row {
			if v <= 1e-9 {
				continue
			}
			x0, x1 := trX(h.t[j]-h.step), trX(h.t[j])
			y0, y1 := trY(float64(i)), trY(float64(i+1))
			r := vg.Rectangle{Min: vg.Point{X: x0 + 0.5, Y: y0 + 0.5}, Max: vg.Point{X: x1 - 0.5, Y: y1 - 0.5}}
			poly := c.ClipPolygonXY([]vg.Point{r.Min, {X: r.Max.X, Y: r.Min.Y}, r.Max, {X: r.Min.X, Y: r.Max.Y}})
			c.FillPolygon(heatColor(v, h.zmax), poly)
		}
	}
}

// drawColorScale draws the heatmap's colour scale along the bottom of c and
// returns its height.
func drawColorScale(c draw.Canvas, zmax float64, what string) float64 {
	st := textStyle(sans, 11, colDim)
	st.YAlign = draw.YCenter
	y := c.Min.Y + vg.Length(legendLH/2+2)
	x := c.Min.X + 4
	c.FillText(st, vg.Point{X: x, Y: y}, "0")
	x += st.Width("0") + 6
	const n, w = 24, 6.0
	for i := 0; i < n; i++ {
		fillRect(c, vg.Rectangle{Min: vg.Point{X: x, Y: y - 5}, Max: vg.Point{X: x + w, Y: y + 5}}, heatColor(float64(i+1)/n*zmax, zmax))
		x += w
	}
	label := formatValue("short", zmax, zmax, 0)
	if what != "" {
		label += " " + what
	}
	c.FillText(st, vg.Point{X: x + 6, Y: y}, strings.TrimSpace(label))
	return legendLH + 4
}

// reservedColors are the colours the picture is drawn with.
func reservedColors() []color.Color {
	cs := []color.Color{colBG, colPanel, colBorder, colText, colDim, colGrid, colErr}
	cs = append(cs, palette...)
	for i := 0; i <= 8; i++ {
		cs = append(cs, heatColor(float64(i)/8, 1))
	}
	return cs
}

// encodePNG writes img as a compressed PNG with at most 256 colours, which
// for flat-coloured charts looks the same and is about three times smaller.
func encodePNG(w io.Writer, img image.Image) error {
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	return enc.Encode(w, quantize(img))
}

// quantize maps img to a palette of its 256 most frequent colours (by
// popularity over 5-bit-per-channel buckets; exact when it has no more than
// 256 colours), each pixel to the nearest palette colour.
func quantize(img image.Image) *image.Paletted {
	b := img.Bounds()
	rgba, ok := img.(*image.RGBA)
	if !ok {
		rgba = image.NewRGBA(b)
		stddraw.Draw(rgba, b, img, b.Min, stddraw.Src)
	}
	key := func(i int) uint32 {
		p := rgba.Pix[i : i+3 : i+3]
		return uint32(p[0])<<16 | uint32(p[1])<<8 | uint32(p[2])
	}
	exact := map[uint32]int{}
	type bucket struct{ n, r, g, b int }
	buckets := make([]bucket, 1<<15)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			i := rgba.PixOffset(x, y)
			k := key(i)
			if len(exact) <= 256 {
				exact[k]++
			}
			p := rgba.Pix[i : i+3 : i+3]
			bk := &buckets[int(p[0]>>3)<<10|int(p[1]>>3)<<5|int(p[2]>>3)]
			bk.n++
			bk.r += int(p[0])
			bk.g += int(p[1])
			bk.b += int(p[2])
		}
	}
	var pal color.Palette
	if len(exact) <= 256 {
		for k := range exact {
			pal = append(pal, color.RGBA{uint8(k >> 16), uint8(k >> 8), uint8(k), 0xff})
		}
	} else {
		// The theme's and the series' colours are always in: a series
		// drawn with a thin line has too few pixels to win by popularity.
		for _, c := range reservedColors() {
			pal = append(pal, color.RGBAModel.Convert(c).(color.RGBA))
		}
		idx := make([]int, 0, len(buckets))
		for i, bk := range buckets {
			if bk.n > 0 {
				idx = append(idx, i)
			}
		}
		sort.Slice(idx, func(i, j int) bool { return buckets[idx[i]].n > buckets[idx[j]].n })
		for _, i := range idx[:min(256-len(pal), len(idx))] {
			bk := buckets[i]
			pal = append(pal, color.RGBA{uint8(bk.r / bk.n), uint8(bk.g / bk.n), uint8(bk.b / bk.n), 0xff})
		}
	}
	out := image.NewPaletted(b, pal)
	cache := map[uint32]uint8{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			k := key(rgba.PixOffset(x, y))
			ci, ok := cache[k]
			if !ok {
				best := math.MaxInt
				r, g, bl := int(k>>16), int(k>>8&0xff), int(k&0xff)
				for j, c := range pal {
					pc := c.(color.RGBA)
					dr, dg, db := r-int(pc.R), g-int(pc.G), bl-int(pc.B)
					// Weighted towards green, which the eye sees best.
					if d := 3*dr*dr + 4*dg*dg + 2*db*db; d < best {
						best, ci = d, uint8(j)
					}
				}
				cache[k] = ci
			}
			out.Pix[out.PixOffset(x, y)] = ci
		}
	}
	return out
}
