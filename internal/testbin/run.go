package testbin

import (
	"bytes"
	"errors"
	"os/exec"
	"testing"
)

// Run runs cmd to its end and returns its exit status and what it wrote
// on stdout and stderr; a command that could not run at all fails t.
func Run(t testing.TB, cmd *exec.Cmd) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}
