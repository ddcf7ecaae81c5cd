package sweep

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
)

// DryRunFlag makes `pstrain run` check its flags, print every run flag's
// resolved value (one --KEY=VALUE a line) and exit without starting
// anything.
const DryRunFlag = "--dry-run"

// RunResolver is the Resolver of the pstrain binary exe: it asks
// `EXE run --dry-run --KEY=VALUE...` to check a configuration and fill in
// the defaults. The lab thus knows pstrain's run flags only through its
// command line, and a grid is checked by the very binary that will run it.
func RunResolver(ctx context.Context, exe string) Resolver {
	return func(params map[string]string) (map[string]string, error) {
		if _, ok := params[KeyCPUs]; ok {
			return nil, errors.New("cpus is not a run flag")
		}
		keys := make([]string, 0, len(params))
		for k := range params {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		args := []string{"run", DryRunFlag}
		for _, k := range keys {
			args = append(args, "--"+k+"="+params[k])
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			if msg, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n"); msg != "" {
				return nil, errors.New(msg)
			}
			return nil, fmt.Errorf("%s run %s: %w", exe, DryRunFlag, err)
		}
		return parseDryRun(stdout.String())
	}
}

// parseDryRun takes the sweep's keys from `pstrain run --dry-run`'s
// output. A binary without --model trains only the MLP.
func parseDryRun(out string) (map[string]string, error) {
	params := map[string]string{"model": "mlp"}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "--"), "=")
		if !ok {
			continue
		}
		n++
		if slices.Contains(Keys(), k) && k != KeyCPUs {
			params[k] = v
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("pstrain run %s printed no flags: %q", DryRunFlag, out)
	}
	return params, nil
}
