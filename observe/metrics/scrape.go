package metrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// maxScrapeBytes bounds the size of a /metrics response Scrape accepts.
const maxScrapeBytes = 64 << 20

// Families is a parsed metrics exposition: metric families by name. Its
// accessors select series by label subset: a series matches labels when it
// has every given name with the given value (other labels are ignored; a nil
// or empty map matches every series).
type Families map[string]*dto.MetricFamily

// Scrape fetches url (a full URL, e.g. "http://127.0.0.1:9100/metrics") with
// a GET bounded by ctx and parses the response into Families. A status other
// than 200 is an error quoting the start of the response body.
func Scrape(ctx context.Context, url string) (Families, error) {
	return ScrapeWith(ctx, http.DefaultClient, url)
}

// ScrapeWith is Scrape through client (for example one with the
// credentials and the certificate of a web config file:
// observe/webconfig).
func ScrapeWith(ctx context.Context, client *http.Client, url string) (Families, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("metrics: scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: scrape: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("metrics: scrape %s: %s: %q", url, resp.Status, body)
	}
	fams, err := Parse(io.LimitReader(resp.Body, maxScrapeBytes), expfmt.ResponseFormat(resp.Header))
	if err != nil {
		return nil, fmt.Errorf("metrics: scrape %s: %w", url, err)
	}
	return fams, nil
}

// Parse reads a metrics exposition in the given format (as returned by
// expfmt.ResponseFormat; the text format when unknown) into Families.
func Parse(r io.Reader, format expfmt.Format) (Families, error) {
	dec := expfmt.NewDecoder(r, format)
	fams := Families{}
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			return fams, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parsing metrics: %w", err)
		}
		fams[mf.GetName()] = mf
	}
}

// Gather collects g (for example a *prometheus.Registry) into Families, for
// reading in-process metrics with the same accessors as scraped ones. As with
// g.Gather, the families gathered are returned along with any error.
func Gather(g prometheus.Gatherer) (Families, error) {
	mfs, err := g.Gather()
	fams := make(Families, len(mfs))
	for _, mf := range mfs {
		fams[mf.GetName()] = mf
	}
	return fams, err
}

// Names returns the family names, sorted.
func (f Families) Names() []string {
	names := make([]string, 0, len(f))
	for n := range f {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Has reports whether a family called name is present.
func (f Families) Has(name string) bool {
	_, ok := f[name]
	return ok
}

// Sample is one series of a counter, gauge or untyped family.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Series returns the series of the counter, gauge or untyped family name that
// match labels, in exposition order. It returns nil if the family is absent
// or of another type.
func (f Families) Series(name string, labels map[string]string) []Sample {
	mf, ok := f[name]
	if !ok {
		return nil
	}
	var out []Sample
	for _, m := range mf.GetMetric() {
		v, ok := scalarValue(mf.GetType(), m)
		if !ok || !matches(m, labels) {
			continue
		}
		out = append(out, Sample{Labels: labelMap(m), Value: v})
	}
	return out
}

// Value returns the value of the one series of the counter, gauge or untyped
// family name that matches labels. It reports false if the family is absent,
// of another type, or if no series or more than one matches.
func (f Families) Value(name string, labels map[string]string) (float64, bool) {
	s := f.Series(name, labels)
	if len(s) != 1 {
		return 0, false
	}
	return s[0].Value, true
}

// Sum returns the sum over the series of the counter, gauge or untyped family
// name that match labels (all series when labels is nil), for example the
// bytes sent over all RPC ops. It is 0 if nothing matches.
func (f Families) Sum(name string, labels map[string]string) float64 {
	var sum float64
	for _, s := range f.Series(name, labels) {
		sum += s.Value
	}
	return sum
}

// LabelValues returns the distinct values of label among the series of
// the family name, in exposition order (nil if the family is absent).
func (f Families) LabelValues(name, label string) []string {
	mf, ok := f[name]
	if !ok {
		return nil
	}
	var out []string
	for _, m := range mf.GetMetric() {
		if v := labelValue(m, label); v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// Bucket is one cumulative histogram bucket: Count observations were less
// than or equal to UpperBound.
type Bucket struct {
	UpperBound float64
	Count      uint64
}

// Histogram is a classic Prometheus histogram, possibly the merge of several
// series.
type Histogram struct {
	Count   uint64   // number of observations
	Sum     float64  // sum of observations
	Buckets []Bucket // cumulative, by increasing UpperBound; +Inf is implied by Count
}

// Histogram returns the merge (bucket-wise sum) of the series of the histogram
// family name that match labels, e.g. every op of
// pstrain_ps_request_duration_seconds for labels nil. It reports false if the
// family is absent, not a histogram, or no series matches.
func (f Families) Histogram(name string, labels map[string]string) (Histogram, bool) {
	mf, ok := f[name]
	if !ok || mf.GetType() != dto.MetricType_HISTOGRAM {
		return Histogram{}, false
	}
	var (
		h       Histogram
		found   bool
		buckets = map[float64]uint64{}
	)
	for _, m := range mf.GetMetric() {
		if !matches(m, labels) || m.GetHistogram() == nil {
			continue
		}
		found = true
		mh := m.GetHistogram()
		h.Count += mh.GetSampleCount()
		h.Sum += mh.GetSampleSum()
		for _, b := range mh.GetBucket() {
			if math.IsInf(b.GetUpperBound(), +1) {
				continue
			}
			buckets[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	if !found {
		return Histogram{}, false
	}
	for ub, c := range buckets {
		h.Buckets = append(h.Buckets, Bucket{UpperBound: ub, Count: c})
	}
	slices.SortFunc(h.Buckets, func(a, b Bucket) int { return cmp.Compare(a.UpperBound, b.UpperBound) })
	return h, true
}

// Mean returns Sum/Count, or NaN when there are no observations.
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	return h.Sum / float64(h.Count)
}

// Quantile estimates the q-quantile (0 <= q <= 1) the way PromQL's
// histogram_quantile does: by linear interpolation inside the bucket holding
// the rank, with 0 as the lower bound of the first bucket (when positive). It
// returns the highest finite bound when the rank falls in the +Inf bucket and
// NaN when there are no observations or q is out of range.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 || q < 0 || q > 1 || math.IsNaN(q) {
		return math.NaN()
	}
	rank := q * float64(h.Count)
	lower, below := 0.0, uint64(0)
	for i, b := range h.Buckets {
		if i == 0 && b.UpperBound <= 0 {
			lower = b.UpperBound
		}
		if float64(b.Count) >= rank {
			if b.Count == below {
				return b.UpperBound
			}
			return lower + (b.UpperBound-lower)*(rank-float64(below))/float64(b.Count-below)
		}
		lower, below = b.UpperBound, b.Count
	}
	if len(h.Buckets) == 0 {
		return math.NaN()
	}
	return h.Buckets[len(h.Buckets)-1].UpperBound
}

func scalarValue(t dto.MetricType, m *dto.Metric) (float64, bool) {
	switch t {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue(), m.GetCounter() != nil
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue(), m.GetGauge() != nil
	case dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue(), m.GetUntyped() != nil
	}
	return 0, false
}

// matches reports whether m has every label of want with the wanted value. As
// in Prometheus, an absent label has the empty value.
func matches(m *dto.Metric, want map[string]string) bool {
	for name, value := range want {
		if labelValue(m, name) != value {
			return false
		}
	}
	return true
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

func labelMap(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}
