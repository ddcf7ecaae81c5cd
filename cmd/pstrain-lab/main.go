// Command pstrain-lab is pstrain's laboratory: experiment sweeps over
// `pstrain run` configurations (package lab/sweep) and their plots
// (package lab/figures). It is a binary of its own so that the training
// binary does not link the plotting libraries; `pstrain sweep` and
// `pstrain plot` run it from beside pstrain, under pstrain's name.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pstrain/pstrain/internal/cli"
)

const usage = `%[1]s — experiment sweeps and their plots

Usage:
  %[1]s sweep --grid SPEC --out DIR   run a grid of pstrain run configurations: results.csv, summary.md, plots
  %[1]s plot DIR                      re-draw a sweep's plots from its results.csv

Run '%[1]s COMMAND -h' for a command's flags. A command-line mistake exits
with status 2, a failure with status 1, an interrupted sweep with 130 or 143.
`

func main() {
	prog := filepath.Base(os.Args[0])
	ctx, stop := watchSignals()
	err := run(ctx, prog, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(os.Stderr, prog, err, context.Cause(ctx)))
}

// signalCause is why the context was cancelled: SIGINT or SIGTERM.
type signalCause struct{ sig syscall.Signal }

func (s signalCause) Error() string { return s.sig.String() }

// watchSignals returns a context cancelled by the first SIGINT or SIGTERM
// (a sweep then stops its run and writes what finished); a second one
// ends the process at once. stop ends the watch.
func watchSignals() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			signal.Reset(os.Interrupt, syscall.SIGTERM)
			cancel(signalCause{s.(syscall.Signal)})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
	}
}

// exitCode prints err as main reports it and returns the exit status:
// 0, 2 for a usage error, 128+N after signal N, else 1.
func exitCode(w io.Writer, prog string, err, cause error) int {
	var ue *usageError
	var sig signalCause
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(cause, &sig):
		fmt.Fprintf(w, "%s: interrupted: %v\n", prog, err)
		return 128 + int(sig.sig)
	case errors.As(err, &ue):
		name := strings.TrimSpace(prog + " " + ue.cmd)
		fmt.Fprintf(w, "%s: %v\nrun '%s -h' for usage\n", name, ue.err, name)
		return 2
	default:
		fmt.Fprintf(w, "%s: %v\n", prog, err)
		return 1
	}
}

// command is a subcommand: prog is the program's name for messages, args
// the arguments after the command's name.
type command func(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) error

var commands = map[string]command{
	"sweep": cmdSweep,
	"plot":  cmdPlot,
}

// run runs the command line args (without the program name).
func run(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return &usageError{err: errors.New("no command given")}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(stdout, usage, prog)
		return nil
	}
	cmd := commands[args[0]]
	if cmd == nil {
		return &usageError{err: fmt.Errorf("unknown command %q", args[0])}
	}
	err := cmd(ctx, prog, args[1:], stdout, stderr)
	var ue *usageError
	if errors.As(err, &ue) {
		ue.cmd = args[0]
	}
	return err
}

// usageError is a command-line mistake of the command cmd.
type usageError struct {
	cmd string
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error {
	return &usageError{err: fmt.Errorf(format, a...)}
}

// newFlagSet returns a command's flag set; -h prints "usage: PROG
// SYNOPSIS", about and the flags to stdout.
func newFlagSet(prog, name, synopsis, about string) *flag.FlagSet {
	return cli.NewFlagSet(prog, name, synopsis, about)
}

// parseFlags parses args with fs: -h prints the help to stdout and
// returns flag.ErrHelp; a mistake is a usage error.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	err := cli.Parse(fs, args, stdout)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return &usageError{err: err}
	}
	return err
}
