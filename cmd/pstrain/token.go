package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/pstrain/pstrain/transport/auth"
)

// cmdToken makes a run's secret.
func cmdToken(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("token", "token [--force] FILE", "Make a run's secret for --auth-token-file: 256 random bits, mode 0600. Every task of\nthe run needs the same file (on Kubernetes, a Secret).")
	force := fs.Bool("force", false, "overwrite FILE (tasks running with the old token can no longer talk to new ones)")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return &usageError{cmd: "token", err: errors.New("want one argument, the file to write")}
	}
	path := fs.Arg(0)
	if _, err := os.Stat(path); err == nil && !*force {
		return fmt.Errorf("%s exists (pass --force to replace it)", path)
	}
	t, err := auth.NewToken(nil)
	if err != nil {
		return err
	}
	if err := auth.WriteTokenFile(path, t); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s; pass --auth-token-file=%s to every task of the run\n", path, path)
	return ctx.Err()
}

// bindTokenFlag registers --auth-token-file on fs.
func bindTokenFlag(fs *flag.FlagSet) *string {
	return fs.String("auth-token-file", "", "the run's secret, the same file for every task: tasks prove it to the chief and sign every request with the session it issues (make one with: pstrain token FILE; default: "+auth.TokenFile+" in --tls-dir)")
}

// loadToken reads the task's token: file, or auth-token in the TLS
// directory.
func loadToken(file, tlsDir string) (*auth.Keyring, error) {
	if file == "" && tlsDir != "" {
		if p := filepath.Join(tlsDir, auth.TokenFile); exists(p) {
			file = p
		}
	}
	if file == "" {
		return nil, usagef("no run secret: pass --auth-token-file FILE, the same file for every task of the run (make one with: pstrain token FILE)")
	}
	t, err := auth.ReadTokenFile(file)
	if err != nil {
		return nil, err
	}
	return auth.NewKeyring(t), nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
