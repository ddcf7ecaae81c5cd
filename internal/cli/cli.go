// Package cli holds what the pstrain commands' flag handling shares: a
// command's flag set with its help, and parsing that tells a request for
// help from a mistake.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// NewFlagSet returns the flag set of command name, parsed by Parse: -h
// prints "usage: PROG SYNOPSIS", about and the flags (if it has any).
func NewFlagSet(prog, name, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s %s\n\n%s\n", prog, synopsis, about)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// Parse parses args with fs. -h prints the help to stdout and returns
// flag.ErrHelp; a mistake is returned as the flag package reports it
// (the caller makes it its usage error), and nothing is printed for it.
func Parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard) // the flag package prints the error and the usage there
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return flag.ErrHelp
	}
	return err
}
