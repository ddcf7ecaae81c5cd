package sweep

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// Keys returns the keys a grid may vary, in the order results.csv lists
// them: `pstrain run` flags, and KeyCPUs, which the sweep applies itself.
func Keys() []string {
	return []string{"mode", "model", "workers", "ps", KeyCPUs, "batch", "lr", "momentum", "optimizer", "lr-schedule", "warmup-steps", "hidden", "conv",
		"epochs", "data-fraction", "dataset", "staleness", "replicas-to-aggregate",
		"target-accuracy", "seed", "eval-every",
	}
}

// KeyCPUs pins every process of a run to that many CPUs (the first ones
// the sweep itself may use), or CPUsAll (no pinning). It is not a run flag:
// the sweep starts `pstrain run` under taskset, and every task inherits the
// affinity.
const (
	KeyCPUs = "cpus"
	CPUsAll = "all"
)

// Models are the values of the model key (`pstrain run --model`).
func Models() []string { return []string{"mlp", "cnn"} }

// checkValue checks what ParseGrid can check of a value without the run
// configuration: the keys the run flags do not know (cpus) or that this
// build's run flags may not have yet (model).
func checkValue(key, v string) error {
	switch key {
	case "model":
		if !slices.Contains(Models(), v) {
			return fmt.Errorf("grid: model=%s: want one of %s", v, strings.Join(Models(), ", "))
		}
	case KeyCPUs:
		if err := checkCPUs(v, math.MaxInt); err != nil {
			return fmt.Errorf("grid: %w", err)
		}
	}
	return nil
}

// isKey reports whether k is one of Keys.
func isKey(k string) bool { return slices.Contains(Keys(), k) }

// Axis is one grid dimension: a run flag and the values it takes.
type Axis struct {
	Key    string
	Values []string
}

// Grid is a parsed grid specification, axes in the order given.
type Grid []Axis

// ParseGrid parses a grid specification: axes separated by ';', each
// "KEY=V1,V2,...". Keys are `pstrain run` flag names (see Keys). A hidden
// layer list is written with '+' inside a value ("hidden=800,256+128" is two
// values: 800, and 256 then 128) because ',' separates values. Empty axes
// (e.g. a trailing ';') are ignored. A key may appear once, a value once per
// key. Values are only checked for syntax here; Expand checks them against
// the run configuration.
func ParseGrid(spec string) (Grid, error) {
	var g Grid
	seen := map[string]bool{}
	for _, part := range strings.Split(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, vs, ok := strings.Cut(part, "=")
		k = strings.TrimSpace(strings.TrimPrefix(k, "--"))
		if !ok || k == "" {
			return nil, fmt.Errorf("grid: %q: want KEY=VALUE[,VALUE...]", part)
		}
		if !isKey(k) {
			return nil, fmt.Errorf("grid: unknown key %q (want one of %s)", k, strings.Join(Keys(), ", "))
		}
		if seen[k] {
			return nil, fmt.Errorf("grid: key %q appears twice", k)
		}
		seen[k] = true
		ax := Axis{Key: k}
		for _, v := range strings.Split(vs, ",") {
			v = strings.TrimSpace(v)
			if v == "" {
				return nil, fmt.Errorf("grid: key %q has an empty value in %q", k, part)
			}
			if err := checkValue(k, v); err != nil {
				return nil, err
			}
			if slices.Contains(ax.Values, v) {
				return nil, fmt.Errorf("grid: key %q lists value %q twice", k, v)
			}
			ax.Values = append(ax.Values, v)
		}
		g = append(g, ax)
	}
	if len(g) == 0 {
		return nil, fmt.Errorf("grid: empty specification (want e.g. 'mode=sync,async;workers=1,2')")
	}
	return g, nil
}

// Varied returns the keys with more than one value, in grid order.
func (g Grid) Varied() []string {
	var out []string
	for _, ax := range g {
		if len(ax.Values) > 1 {
			out = append(out, ax.Key)
		}
	}
	return out
}

// Size is the number of configurations.
func (g Grid) Size() int {
	n := 1
	for _, ax := range g {
		n *= len(ax.Values)
	}
	return n
}

// String renders the grid in ParseGrid's syntax.
func (g Grid) String() string {
	parts := make([]string, len(g))
	for i, ax := range g {
		parts[i] = ax.Key + "=" + strings.Join(ax.Values, ",")
	}
	return strings.Join(parts, ";")
}

// Resolver checks one configuration and completes it: given the grid's
// values for some run-flag keys (flag syntax, e.g. "hidden" as "256,128"),
// it returns a value for every key in Keys except KeyCPUs (defaults filled
// in) or an error naming the bad key and value. RunResolver implements it
// with `pstrain run --dry-run`.
type Resolver func(params map[string]string) (map[string]string, error)

// Config is one configuration of a grid, fully resolved.
type Config struct {
	// ID identifies the configuration by its parameters (not by its
	// position in the grid), so a changed grid still finds earlier runs.
	ID string
	// Params holds a value for every key in Keys, in flag syntax.
	Params map[string]string
}

// Expand lists every configuration of g (the last axis varies fastest),
// resolved and validated by resolve; a cpus value must be at most
// availableCPUs (the CPUs the sweep may pin runs to). It fails on the first
// bad configuration, before anything runs.
func (g Grid) Expand(resolve Resolver, availableCPUs int) ([]Config, error) {
	if resolve == nil {
		return nil, fmt.Errorf("grid: no resolver")
	}
	var out []Config
	idx := make([]int, len(g))
	for {
		params := map[string]string{}
		cpus := CPUsAll
		for i, ax := range g {
			if ax.Key == KeyCPUs {
				cpus = ax.Values[idx[i]]
				continue
			}
			params[ax.Key] = flagValue(ax.Key, ax.Values[idx[i]])
		}
		if err := checkCPUs(cpus, availableCPUs); err != nil {
			return nil, fmt.Errorf("grid: configuration %s: %w", describe(g, idx), err)
		}
		full, err := resolve(params)
		if err != nil {
			return nil, fmt.Errorf("grid: configuration %s: %w", describe(g, idx), err)
		}
		full[KeyCPUs] = cpus
		for _, k := range Keys() {
			if _, ok := full[k]; !ok {
				return nil, fmt.Errorf("grid: resolver left %q unset", k)
			}
		}
		out = append(out, Config{ID: configID(full), Params: full})
		// Advance the odometer, last axis fastest.
		i := len(g) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < len(g[i].Values) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return out, nil
		}
	}
}

// flagValue converts a grid value to flag syntax.
func flagValue(key, v string) string {
	if key == "hidden" || key == "conv" {
		return strings.ReplaceAll(v, "+", ",")
	}
	return v
}

func describe(g Grid, idx []int) string {
	parts := make([]string, len(g))
	for i, ax := range g {
		parts[i] = ax.Key + "=" + ax.Values[idx[i]]
	}
	return strings.Join(parts, " ")
}

// laterKeys are keys added to Keys after sweeps were first run, with the
// value every run before them had. configID leaves a key out at that
// value, so a configuration keeps the ID it had and an older sweep
// directory still resumes.
var laterKeys = map[string]string{"lr-schedule": "constant", "warmup-steps": "0", "model": "mlp", KeyCPUs: CPUsAll}

// configID hashes the sorted parameters (except the data directory, which
// does not change the run, and laterKeys at their old value).
func configID(params map[string]string) string {
	keys := make([]string, 0, len(params))
	for k, v := range params {
		if old, ok := laterKeys[k]; ok && v == old {
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s=%s\n", k, params[k])
	}
	return hex.EncodeToString(h.Sum(nil))[:10]
}
