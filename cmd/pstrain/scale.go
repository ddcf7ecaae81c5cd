package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/pstrain/pstrain/launcher"
)

// cmdScale is `pstrain scale`: it asks the `pstrain run` on a run
// directory for another number of workers (docs/elastic.md). The run's
// launcher starts or stops worker processes and the chief changes the
// run's worker count at the next epoch boundary; this command returns
// once the request is written.
func cmdScale(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("scale", "scale --run-dir DIR --workers N",
		"Add or remove workers of the running run in DIR (pstrain run --run-dir). The change takes effect at the next\nepoch boundary: the data is split anew from there (sync steps aggregate the new count), removed workers exit.")
	dir := fs.String("run-dir", "run", "the run's directory (pstrain run --run-dir)")
	workers := fs.Int("workers", 0, "the number of workers wanted (1 to the run's --max-workers)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *workers < 1 {
		return usagef("--workers must be at least 1, got %d", *workers)
	}
	was, err := launcher.RequestScale(*dir, *workers)
	if errors.Is(err, launcher.ErrBadScale) {
		return asUsage(err) // a count the run cannot take: the user's value
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "asked the run in %s for %d workers (was %d); the change takes effect at the next epoch boundary\n", *dir, *workers, was)
	return nil
}
