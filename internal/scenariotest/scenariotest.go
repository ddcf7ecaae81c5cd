// Package scenariotest runs a pure core's scenario scripts, in the style
// of etcd's raft: testdata/*.txt read by github.com/cockroachdb/datadriven,
// each block a directive (an event for the core, or a question about it)
// and, after "----", what the core answered. `go test -run Scenarios
// -rewrite` in the package rewrites the expected output. The chief's and
// the worker's scenario tests run on it.
package scenariotest

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// Directive answers one directive of a script, or fails it.
type Directive func(d *datadriven.TestData) (string, error)

// Run replays every testdata/*.txt of the package under test, each as a
// subtest with a fresh scenario from start; it fails if there are fewer
// than min scripts.
func Run(t *testing.T, min int, start func() Directive) {
	t.Helper()
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) < min {
		t.Fatalf("want at least %d scenario files, found %d (%v)", min, len(files), err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			do := start()
			datadriven.RunTest(t, f, func(t *testing.T, d *datadriven.TestData) string {
				got, err := do(d)
				if err != nil {
					t.Fatalf("%s: %s: %v", d.Pos, d.FullCmd(), err)
				}
				return got
			})
		})
	}
}

// Args are a directive's arguments: key=value, or a bare key ("").
type Args map[string]string

// ArgsOf are d's arguments as datadriven parsed them (a value of several
// parts joined by commas).
func ArgsOf(d *datadriven.TestData) Args {
	a := Args{}
	for _, x := range d.CmdArgs {
		a[x.Key] = strings.Join(x.Vals, ",")
	}
	return a
}

// Fields are the arguments of the words key=value or key.
func Fields(words []string) Args {
	a := Args{}
	for _, f := range words {
		k, v, _ := strings.Cut(f, "=")
		a[k] = v
	}
	return a
}

// Num is the integer value of k (0 if absent or not a number).
func (a Args) Num(k string) int64 {
	n, _ := strconv.ParseInt(a[k], 10, 64)
	return n
}

// Has says whether k is given.
func (a Args) Has(k string) bool {
	_, ok := a[k]
	return ok
}

// Err is the error err=MSG names (nil without one).
func (a Args) Err() error {
	if e, ok := a["err"]; ok {
		return errors.New(e)
	}
	return nil
}

// At is the time t=S: S seconds after t0.
func (a Args) At(t0 time.Time) time.Time {
	sec, _ := strconv.ParseFloat(a["t"], 64)
	return t0.Add(time.Duration(sec * float64(time.Second)))
}
