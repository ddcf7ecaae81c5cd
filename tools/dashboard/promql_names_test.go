package dashboard

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// promqlFunctions are the PromQL functions and aggregation operators (the
// identifiers that may be followed by a parenthesis), as of Prometheus 2.x.
var promqlFunctions = setOf(
	// Aggregation operators.
	"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
	"count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio",
	// Functions.
	"abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh",
	"atan", "atanh", "avg_over_time", "ceil", "changes", "clamp", "clamp_max",
	"clamp_min", "cos", "cosh", "count_over_time", "day_of_month",
	"day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv",
	"exp", "floor", "histogram_avg", "histogram_count", "histogram_fraction",
	"histogram_quantile", "histogram_stddev", "histogram_stdvar",
	"histogram_sum", "holt_winters", "double_exponential_smoothing", "hour",
	"idelta", "increase", "irate", "label_join", "label_replace",
	"last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time",
	"min_over_time", "minute", "month", "pi", "predict_linear",
	"present_over_time", "quantile_over_time", "rad", "rate", "resets",
	"round", "scalar", "sgn", "sin", "sinh", "sort", "sort_desc",
	"sort_by_label", "sort_by_label_desc", "sqrt", "stddev_over_time",
	"stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp",
	"vector", "year",
	// The @ modifier's preprocessors: foo @ start().
	"start", "end",
)

// promqlGrouping are the keywords followed by a parenthesised list of label
// names.
var promqlGrouping = setOf("by", "without", "on", "ignoring", "group_left", "group_right")

// promqlKeywords are the other identifiers that are not metric names.
var promqlKeywords = setOf("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan")

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// metricNames returns the metric names a PromQL expression selects, sorted
// and without duplicates. It is a scanner, not a parser: it skips string
// literals, label matchers ({...}), ranges ([...]), numbers and durations,
// and the label lists of by/without/on/ignoring/group_left/group_right, and
// reports every remaining identifier that is not a function, aggregation or
// keyword. A call of an unknown function is an error, so that a misspelt
// function name does not pass for a metric name.
func metricNames(expr string) ([]string, error) {
	var names []string
	i := 0
	n := len(expr)
	skipSpace := func(j int) int {
		for j < n && strings.ContainsRune(" \t\r\n", rune(expr[j])) {
			j++
		}
		return j
	}
	// skipString returns the index after the string literal starting at j.
	skipString := func(j int) (int, error) {
		q := expr[j]
		for j++; j < n; j++ {
			switch {
			case expr[j] == '\\' && q != '`':
				j++
			case expr[j] == q:
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string in %q", expr)
	}
	// skipUntil returns the index after the first close outside strings,
	// scanning from j.
	skipUntil := func(j int, close byte) (int, error) {
		for j < n {
			switch c := expr[j]; {
			case c == '"' || c == '\'' || c == '`':
				var err error
				if j, err = skipString(j); err != nil {
					return 0, err
				}
			case c == close:
				return j + 1, nil
			default:
				j++
			}
		}
		return 0, fmt.Errorf("missing %q in %q", close, expr)
	}
	isIdentStart := func(c byte) bool {
		return c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
	}
	isIdent := func(c byte) bool { return isIdentStart(c) || ('0' <= c && c <= '9') }

	for i < n {
		c := expr[i]
		var err error
		switch {
		case c == '"' || c == '\'' || c == '`':
			i, err = skipString(i)
		case c == '{':
			i, err = skipUntil(i+1, '}')
		case c == '[':
			i, err = skipUntil(i+1, ']')
		case c == '#': // comment
			for i < n && expr[i] != '\n' {
				i++
			}
		case '0' <= c && c <= '9', c == '.':
			// Number or duration: 0.5, 1e-9, 0x1f, 5m, 1h30m.
			for i < n && (isIdent(expr[i]) || expr[i] == '.' ||
				((expr[i] == '-' || expr[i] == '+') && (expr[i-1] == 'e' || expr[i-1] == 'E'))) {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < n && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			lower := strings.ToLower(word)
			next := skipSpace(j)
			switch {
			case promqlGrouping[lower]:
				i = next
				if i < n && expr[i] == '(' {
					i, err = skipUntil(i+1, ')')
				}
			case next < n && expr[next] == '(':
				if !promqlFunctions[lower] {
					return nil, fmt.Errorf("unknown PromQL function %q in %q", word, expr)
				}
				i = j
			case promqlFunctions[lower] || promqlKeywords[lower]:
				// Aggregation followed by by/without, or an operator keyword.
				i = j
			default:
				names = append(names, word)
				i = j
			}
		default:
			i++
		}
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (le, op) (rate(foo_bucket{job=~"$job",instance=~"a}b"}[$__rate_interval]))`, []string{"foo_bucket"}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_bucket{a="b"}[5m])))`, []string{"x_bucket"}},
		{`sum without (instance) (a_total) / ignoring (phase) group_left () sum(b)`, []string{"a_total", "b"}},
		{`time() - max(ts{job="x"} > 0)`, []string{"ts"}},
		{`a offset 1h30m and on (task) b or c unless bool d`, []string{"a", "b", "c", "d"}},
		{`max by (host) (label_replace(load{x="y"}, "host", "$1", "instance", "(.*):[0-9]+"))`, []string{"load"}},
		{`sum(rate(x[1m:10s])) * 1e-9 + 0x1f - Inf`, []string{"x"}},
		{"foo # comment mentioning bar\n + baz", []string{"baz", "foo"}},
		{`clamp_min(max(deriv(g[$__rate_interval])), 0) + g`, []string{"g"}},
		{`count_values("value", build_info) @ start()`, []string{"build_info"}},
	} {
		got, err := metricNames(tc.expr)
		if err != nil {
			t.Errorf("metricNames(%q): %v", tc.expr, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{`rat(x[5m])`, `x{a="b"`, `sum(x) by (a`, `"open`} {
		if got, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q) = %q, want an error", bad, got)
		}
	}
}

func TestSubstitute(t *testing.T) {
	vars := map[string]string{"job": "pstrain", "instance": ".*", "__rate_interval": "30s"}
	got, err := Substitute(`rate(x{job=~"$job",instance=~"${instance}",a=~"[[job:regex]]"}[$__rate_interval]) + label_replace(y, "h", "$1", "i", "(.*)")`, vars)
	if err != nil {
		t.Fatal(err)
	}
	want := `rate(x{job=~"pstrain",instance=~".*",a=~"pstrain"}[30s]) + label_replace(y, "h", "$1", "i", "(.*)")`
	if got != want {
		t.Errorf("Substitute:\n got %s\nwant %s", got, want)
	}
	if _, err := Substitute(`x{a=~"$nope"}`, vars); err == nil || !strings.Contains(err.Error(), "$nope") {
		t.Errorf("Substitute with an unknown variable: err = %v, want one naming $nope", err)
	}
}
