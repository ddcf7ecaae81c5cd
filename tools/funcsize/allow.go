package main

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Entry is one allowlisted function and the size it may not exceed.
type Entry struct {
	Key        string // "DIR NAME", as Func.Key
	Lines      int
	Complexity int
}

// ParseAllow reads an allowlist: "LINES COMPLEXITY DIR NAME" a line;
// blank lines and # comments are ignored.
func ParseAllow(r io.Reader) (map[string]Entry, error) {
	entries := map[string]Entry{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := parseEntry(line)
		if err != nil {
			return nil, fmt.Errorf("funcsize: allowlist line %d: %w", n, err)
		}
		if _, dup := entries[e.Key]; dup {
			return nil, fmt.Errorf("funcsize: allowlist line %d: %s listed twice", n, e.Key)
		}
		entries[e.Key] = e
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("funcsize: read allowlist: %w", err)
	}
	return entries, nil
}

func parseEntry(line string) (Entry, error) {
	fields := strings.Fields(line)
	if len(fields) != 4 {
		return Entry{}, fmt.Errorf("want \"LINES COMPLEXITY DIR NAME\", got %q", line)
	}
	lines, err := strconv.Atoi(fields[0])
	if err != nil {
		return Entry{}, fmt.Errorf("lines: %w", err)
	}
	cc, err := strconv.Atoi(fields[1])
	if err != nil {
		return Entry{}, fmt.Errorf("complexity: %w", err)
	}
	return Entry{Key: fields[2] + " " + fields[3], Lines: lines, Complexity: cc}, nil
}

// WriteAllow writes the violations among funcs as an allowlist.
func WriteAllow(w io.Writer, funcs []Func, lim Limits) error {
	for _, f := range funcs {
		if !lim.Violates(f) {
			continue
		}
		if _, err := fmt.Fprintf(w, "%d %d %s\n", f.Lines, f.Complexity, f.Key()); err != nil {
			return fmt.Errorf("funcsize: write allowlist: %w", err)
		}
	}
	return nil
}

// Problem is one reason the check fails.
type Problem struct {
	Key string
	Msg string
}

func (p Problem) String() string { return p.Key + ": " + p.Msg }

// Check compares the measured functions with the allowlist and returns
// every new violation, every regression of a listed function, and every
// stale entry (a listed function that is within the limits or is gone),
// sorted by key.
func Check(funcs []Func, allow map[string]Entry, lim Limits) []Problem {
	var probs []Problem
	seen := map[string]bool{}
	for _, f := range funcs {
		key := f.Key()
		e, listed := allow[key]
		if listed {
			seen[key] = true
		}
		probs = append(probs, checkFunc(f, e, listed, lim)...)
	}
	for key := range allow {
		if !seen[key] {
			probs = append(probs, Problem{key, "listed in the allowlist but not found: delete the entry"})
		}
	}
	sort.SliceStable(probs, func(i, j int) bool { return probs[i].Key < probs[j].Key })
	return probs
}

func checkFunc(f Func, e Entry, listed bool, lim Limits) []Problem {
	at := fmt.Sprintf(" (%s:%d)", f.File, f.Line)
	if !lim.Violates(f) {
		if listed {
			return []Problem{{f.Key(), fmt.Sprintf("now %d lines, complexity %d, within the limits: delete its allowlist entry%s", f.Lines, f.Complexity, at)}}
		}
		return nil
	}
	var probs []Problem
	if f.Lines > max(lim.Lines, e.Lines) {
		probs = append(probs, Problem{f.Key(), fmt.Sprintf("%d lines, over the limit of %d%s%s", f.Lines, lim.Lines, allowed(listed, e.Lines), at)})
	}
	if f.Complexity > max(lim.Complexity, e.Complexity) {
		probs = append(probs, Problem{f.Key(), fmt.Sprintf("cyclomatic complexity %d, over the limit of %d%s%s", f.Complexity, lim.Complexity, allowed(listed, e.Complexity), at)})
	}
	return probs
}

func allowed(listed bool, n int) string {
	if !listed {
		return ""
	}
	return fmt.Sprintf(" and over the %d the allowlist grants", n)
}
