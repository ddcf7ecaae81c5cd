package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/pstrain/pstrain/launcher"
)

// cmdScale is `pstrain scale`: it asks the `pstrain run` on a run
// directory for another number of workers or of parameter servers
// (docs/elastic.md). The run's launcher starts or stops the processes
// and the chief changes the run's worker count at the next epoch
// boundary, or moves the model to the new PS count once every shard is
// held (sync: at a step boundary); this command returns once the
// request is written.
func cmdScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("scale", "scale --run-dir DIR (--workers N | --ps N | --rebalance)",
		"Add or remove workers, or parameter servers, of the running run in DIR (pstrain run --run-dir).\n"+
			"A worker change takes effect at the next epoch boundary: the data is split anew from there (sync steps aggregate\n"+
			"the new count), removed workers exit. A PS change moves the model's row blocks to the new count once every shard\n"+
			"is held (sync: at a step boundary; the run needs --max-ps slots); removed parameter servers exit.\n"+
			"--rebalance measures how long each parameter server keeps the workers per step over the last 5 s and, if the\n"+
			"slowest keeps them 1.25x as long as the fastest or more, moves rows from slower to faster ones the same way;\n"+
			"else it refuses (exit 1). Ask again to move further: each rebalance measures the layout it finds.")
	dir := fs.String("run-dir", "run", "the run's directory (pstrain run --run-dir)")
	workers := fs.Int("workers", 0, "the number of workers wanted (1 to the run's --max-workers)")
	ps := fs.Int("ps", 0, "the number of parameter servers wanted (1 to the run's --max-ps)")
	rebalance := fs.Bool("rebalance", false, "give each parameter server rows in proportion to its measured speed (docs/elastic.md, \"Rebalancing\")")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	// A flag given, even as 0, asks for that change (--rebalance=false:
	// none).
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	set["rebalance"] = *rebalance
	n := 0
	for _, name := range []string{"workers", "ps", "rebalance"} {
		if set[name] {
			n++
		}
	}
	switch {
	case n == 0:
		return usagef("say what to change: --workers N, --ps N or --rebalance")
	case n > 1:
		return usagef("--workers, --ps and --rebalance: one change at a time")
	case *rebalance:
		return scaleRebalance(*dir, stdout)
	case set["ps"]:
		return scalePS(*dir, *ps, stdout)
	case *workers < 1:
		return usagef("--workers must be at least 1, got %d", *workers)
	}
	was, err := launcher.RequestScale(*dir, *workers)
	if errors.Is(err, launcher.ErrBadScale) {
		return asUsage(err) // a count the run cannot take: the user's value
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "asked the run in %s for %s (was %d); the change takes effect at the next epoch boundary\n", *dir, count(*workers, "worker", "workers"), was)
	return nil
}

// scalePS is `pstrain scale --ps N`. A count the run cannot take (a
// ctr model, no checkpoints, beyond --max-ps) exits 1: "cannot scale".
func scalePS(dir string, ps int, stdout io.Writer) error {
	if ps < 1 {
		return usagef("--ps must be at least 1, got %d", ps)
	}
	was, err := launcher.RequestScalePS(dir, ps)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "asked the run in %s for %s (was %d); the model moves once every shard is held (sync: at a step boundary)\n", dir, count(ps, "parameter server", "parameter servers"), was)
	return nil
}

// scaleRebalance is `pstrain scale --rebalance`: it prints what the
// launcher measured and asked for. A refusal (the run cannot change its
// layout, the load cannot be measured, or no shard is 1.25x slower than
// another) exits 1: "cannot scale".
func scaleRebalance(dir string, stdout io.Writer) error {
	a, err := launcher.RequestRebalance(dir)
	if a.Loads != "" {
		fmt.Fprintf(stdout, "measured over the last %s: %s\n", launcher.RebalanceWindow, a.Loads)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "asked the run in %s to rebalance its parameter servers (the slowest kept the workers %.2fx as long as the fastest): weights %s; the rows move once every shard is held (sync: at a step boundary)\n",
		dir, a.Imbalance, weightsText(a.Weights))
	return nil
}

// weightsText is weights as "250:750".
func weightsText(w []int) string {
	parts := make([]string, len(w))
	for i, x := range w {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ":")
}

// count is n with the noun that goes with it ("1 worker", "3 workers").
func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
