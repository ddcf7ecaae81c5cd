package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// labBinary is the laboratory's binary: experiment sweeps and their plots.
// It is built beside pstrain (make build) and kept apart from it so that
// the training binary does not link the plotting libraries.
const labBinary = "pstrain-lab"

// execFunc replaces the process with another program, as syscall.Exec.
type execFunc func(path string, argv, env []string) error

// labCommand is a command that the lab binary runs: `pstrain sweep ARGS`
// becomes `pstrain-lab sweep ARGS` in this process's place, with its
// output, exit status and signals.
func labCommand(name string) command {
	return func(_ context.Context, args []string, _, _ io.Writer) error {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		return execLab(self, name, args, syscall.Exec)
	}
}

// execLab runs the lab binary beside self (the pstrain binary) as
// `pstrain NAME ARGS`: the lab names itself after argv[0], so its help and
// messages read as pstrain's. Missing, it says how to build it.
func execLab(self, name string, args []string, exec execFunc) error {
	lab := filepath.Join(filepath.Dir(self), labBinary)
	if _, err := os.Stat(lab); err != nil {
		return fmt.Errorf("%s runs in %s, not found beside this binary (%w); build both with 'make build', or this one with 'go build -o %s ./cmd/pstrain-lab'",
			name, labBinary, err, lab)
	}
	argv := append([]string{"pstrain", name}, args...)
	if err := exec(lab, argv, os.Environ()); err != nil {
		return fmt.Errorf("running %s: %w", lab, err)
	}
	return nil
}
