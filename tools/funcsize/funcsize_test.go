package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const fixture = "testdata/src"

func measureFixture(t *testing.T) map[string]Func {
	t.Helper()
	funcs, err := Measure([]string{fixture})
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]Func{}
	for _, f := range funcs {
		byKey[f.Key()] = f
	}
	return byKey
}

// The fixture's numbers were checked against gocyclo v0.6.0
// (gocyclo testdata/src/a/a.go).
func TestMeasureFixture(t *testing.T) {
	got := measureFixture(t)
	want := map[string]struct{ lines, cc int }{
		fixture + "/a Each":   {30, 10},
		fixture + "/a Plain":  {3, 1},
		fixture + "/a (*T).M": {1, 1},
		fixture + "/a (U).V":  {1, 1},
		fixture + "/a/b Long": {85, 1},
	}
	for key, w := range want {
		f, ok := got[key]
		if !ok {
			t.Errorf("%s not measured", key)
			continue
		}
		if f.Lines != w.lines || f.Complexity != w.cc {
			t.Errorf("%s: %d lines, complexity %d; want %d, %d", key, f.Lines, f.Complexity, w.lines, w.cc)
		}
	}
	// Generated, .pb.go, _test.go, testdata/ and _dir/ files are skipped.
	for key := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("unexpected function %s", key)
		}
	}
}

func fixtureFuncs(t *testing.T) []Func {
	t.Helper()
	funcs, err := Measure([]string{fixture})
	if err != nil {
		t.Fatal(err)
	}
	return funcs
}

func parse(t *testing.T, text string) map[string]Entry {
	t.Helper()
	allow, err := ParseAllow(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return allow
}

func TestCheckRatchet(t *testing.T) {
	funcs := fixtureFuncs(t)
	lim := Limits{Lines: 80, Complexity: 9} // Long (lines) and Each (complexity) violate
	long := fixture + "/a/b Long"
	each := fixture + "/a Each"
	cases := []struct {
		name  string
		allow string
		want  []string // one substring per expected problem, in key order
	}{
		{"all listed", "85 1 " + long + "\n# comment\n\n30 10 " + each + "\n", nil},
		{"listed with room", "90 1 " + long + "\n30 12 " + each + "\n", nil},
		{"new violation", "85 1 " + long + "\n", []string{each + ": cyclomatic complexity 10, over the limit of 9"}},
		{"worse lines", "84 1 " + long + "\n30 10 " + each + "\n", []string{long + ": 85 lines, over the limit of 80 and over the 84"}},
		{"worse complexity", "85 1 " + long + "\n30 9 " + each + "\n", []string{each + ": cyclomatic complexity 10"}},
		{"stale: within limits", "85 1 " + long + "\n30 10 " + each + "\n3 1 " + fixture + "/a Plain\n", []string{fixture + "/a Plain: now 3 lines, complexity 1, within the limits"}},
		{"stale: gone", "85 1 " + long + "\n30 10 " + each + "\n100 20 x Gone\n", []string{"x Gone: listed in the allowlist but not found"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			probs := Check(funcs, parse(t, c.allow), lim)
			if len(probs) != len(c.want) {
				t.Fatalf("problems %v, want %d", probs, len(c.want))
			}
			for i, p := range probs {
				if !strings.Contains(p.String(), c.want[i]) {
					t.Errorf("problem %q, want it to contain %q", p, c.want[i])
				}
			}
		})
	}
}

// A function listed for its lines alone that grows over the complexity
// limit is reported, and one at its listed complexity is not.
func TestCheckOtherMetric(t *testing.T) {
	funcs := fixtureFuncs(t)
	each := fixture + "/a Each"
	lim := Limits{Lines: 29, Complexity: 9} // Each: 30 lines, complexity 10
	allow := parse(t, "85 1 "+fixture+"/a/b Long\n31 5 "+each+"\n")
	probs := Check(funcs, allow, lim)
	if len(probs) != 1 || probs[0].Key != each || !strings.Contains(probs[0].Msg, "complexity 10") {
		t.Fatalf("problems %v, want Each's complexity alone", probs)
	}
	allow = parse(t, "85 1 "+fixture+"/a/b Long\n31 10 "+each+"\n")
	if probs := Check(funcs, allow, lim); len(probs) != 0 {
		t.Fatalf("unexpected problems %v", probs)
	}
}

func TestParseAllowErrors(t *testing.T) {
	for _, text := range []string{"1 2 x\n", "a 2 x F\n", "1 b x F\n", "1 2 x F\n3 4 x F\n"} {
		if _, err := ParseAllow(strings.NewReader(text)); err == nil {
			t.Errorf("ParseAllow(%q) succeeded", text)
		}
	}
}

// -write records exactly today's violations, and checking against what it
// wrote passes.
func TestRunWriteThenCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allow.txt")
	var out, errb bytes.Buffer
	if st := run([]string{"-complexity", "9", "-allow", path, "-write", fixture}, &out, &errb); st != 0 {
		t.Fatalf("write: status %d, %s", st, errb.String())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "85 1 " + fixture + "/a/b Long\n"
	if !strings.Contains(string(b), "30 10 "+fixture+"/a Each\n") || !strings.Contains(string(b), want) {
		t.Fatalf("allowlist:\n%s", b)
	}
	if st := run([]string{"-complexity", "9", "-allow", path, fixture}, &out, &errb); st != 0 {
		t.Fatalf("check: status %d, %s%s", st, out.String(), errb.String())
	}
	out.Reset()
	// A tighter line limit makes Plain (3 lines) a new violation.
	if st := run([]string{"-lines", "2", "-complexity", "9", "-allow", path, fixture}, &out, &errb); st != 1 || !strings.Contains(out.String(), "/a Plain: 3 lines") {
		t.Fatalf("check with a tighter limit: status %d, want 1; %s", st, out.String())
	}
	if st := run([]string{"-complexity", "9", fixture}, &out, &errb); st != 1 {
		t.Fatalf("report: status %d, want 1", st)
	}
}
