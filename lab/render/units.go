package main

import (
	"math"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
)

// scaled is a value divided by a unit prefix, with the prefix's suffix.
type scaled struct {
	div    float64
	suffix string
}

// unitScale returns how values of the Grafana unit are shown when the
// largest magnitude on display is ref.
func unitScale(unit string, ref float64) scaled {
	ref = math.Abs(ref)
	pick := func(base float64, suffixes []string, unitSuffix string) scaled {
		div := 1.0
		i := 0
		for i+1 < len(suffixes) && ref >= div*base {
			div *= base
			i++
		}
		return scaled{div, suffixes[i] + unitSuffix}
	}
	switch unit {
	case "percentunit":
		return scaled{0.01, "%"}
	case "percent":
		return scaled{1, "%"}
	case "s":
		switch {
		case ref == 0:
			return scaled{1, " s"}
		case ref < 1e-6:
			return scaled{1e-9, " ns"}
		case ref < 1e-3:
			return scaled{1e-6, " µs"}
		case ref < 1:
			return scaled{1e-3, " ms"}
		case ref < 120:
			return scaled{1, " s"}
		case ref < 7200:
			return scaled{60, " min"}
		default:
			return scaled{3600, " h"}
		}
	case "bytes":
		return pick(1024, []string{" B", " KiB", " MiB", " GiB", " TiB"}, "")
	case "Bps":
		return pick(1000, []string{" B", " kB", " MB", " GB", " TB"}, "/s")
	case "reqps":
		return pick(1000, []string{"", " K", " M", " G"}, " req/s")
	case "none":
		return scaled{1, ""}
	default: // "short" and unknown units
		return pick(1000, []string{"", " K", " Mil", " Bil", " Tri"}, "")
	}
}

// formatValue formats v in unit, with enough decimals to tell apart values
// res apart (res <= 0: three significant digits).
func formatValue(unit string, v, ref, res float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	if v == 0 { // "0", "0 B", "0 s", not "0 K" or "0.00 s"
		return "0" + unitScale(unit, 0).suffix
	}
	sc := unitScale(unit, ref)
	x := v / sc.div
	var dec int
	if res > 0 {
		dec = max(0, int(math.Ceil(-math.Log10(res/sc.div)-1e-9)))
	} else if ax := math.Abs(x); ax > 0 {
		dec = max(0, 2-int(math.Floor(math.Log10(ax))))
	}
	dec = min(dec, 4)
	s := strconv.FormatFloat(x, 'f', dec, 64)
	if strings.Contains(s, ".") && res <= 0 {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if s == "-0" {
		s = "0"
	}
	return s + sc.suffix
}

// niceStep returns a 1-2-5 step giving about n intervals over span.
func niceStep(span float64, n int) float64 {
	if span <= 0 || math.IsNaN(span) || math.IsInf(span, 0) {
		return 1
	}
	raw := span / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

// niceStepFor is niceStep in the unit's natural steps: binary ones for bytes,
// so that ticks land on round KiB/MiB.
func niceStepFor(unit string, span float64, n int) float64 {
	if unit == "bytes" {
		sc := unitScale(unit, span)
		return niceStep(span/sc.div, n) * sc.div
	}
	return niceStep(span, n)
}

// yTicks are value ticks labelled in the panel's unit.
type yTicks struct {
	unit string
	step float64
	abs  bool // label |v| (negative-Y transformed series)
}

func (t yTicks) Ticks(lo, hi float64) []plot.Tick {
	ref := math.Max(math.Abs(lo), math.Abs(hi))
	var ts []plot.Tick
	for v := math.Ceil(lo/t.step-1e-9) * t.step; v <= hi+t.step*1e-9; v += t.step {
		if math.Abs(v) < t.step*1e-9 {
			v = 0
		}
		lv := v
		if t.abs {
			lv = math.Abs(v)
		}
		ts = append(ts, plot.Tick{Value: v, Label: formatValue(t.unit, lv, ref, t.step)})
	}
	return ts
}

// timeTicks are clock-time ticks on a unix-seconds axis.
type timeTicks struct {
	n   int // about this many
	loc *time.Location
}

func (t timeTicks) Ticks(lo, hi float64) []plot.Tick {
	span := hi - lo
	step := 1.0
	for _, s := range []float64{1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400} {
		step = s
		if span/s <= float64(t.n) {
			break
		}
	}
	format := "15:04:05"
	if step >= 60 {
		format = "15:04"
	}
	var ts []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi; v += step {
		ts = append(ts, plot.Tick{Value: v, Label: time.Unix(int64(v), 0).In(t.loc).Format(format)})
	}
	return ts
}
