package sweep

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
)

// fakeDryRun imitates `pstrain run --dry-run`: every key at "1" but the
// ones given, and --workers=0 refused as the real binary refuses it.
func fakeDryRun(args []string) int {
	vals := map[string]string{}
	for _, k := range Keys() {
		vals[k] = "1"
	}
	vals["mode"], vals["model"] = "sync", "mlp"
	delete(vals, KeyCPUs)
	for _, a := range args {
		k, v, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if k == "workers" && v == "0" {
			fmt.Fprintln(os.Stderr, "pstrain run: --workers must be at least 1, got 0\nrun 'pstrain run -h' for usage")
			return 2
		}
		vals[k] = v
	}
	fmt.Println("--data-dir=data") // not a sweep key: left out
	for k, v := range vals {
		fmt.Printf("--%s=%s\n", k, v)
	}
	return 0
}

func TestRunResolver(t *testing.T) {
	t.Setenv(fakeEnv, t.TempDir()+"/invocations")
	resolve := RunResolver(context.Background(), os.Args[0])
	p, err := resolve(map[string]string{"mode": "async", "hidden": "256,128"})
	if err != nil {
		t.Fatal(err)
	}
	if p["mode"] != "async" || p["hidden"] != "256,128" || p["workers"] != "1" || p["model"] != "mlp" {
		t.Errorf("resolved %v", p)
	}
	if _, ok := p["data-dir"]; ok || len(p) != len(Keys())-1 {
		t.Errorf("%d keys, want every sweep key but cpus: %v", len(p), p)
	}
	// The binary's own message, first line only.
	if _, err := resolve(map[string]string{"workers": "0"}); err == nil || err.Error() != "pstrain run: --workers must be at least 1, got 0" {
		t.Errorf("workers=0: %v", err)
	}
	if _, err := resolve(map[string]string{KeyCPUs: "1"}); err == nil || !strings.Contains(err.Error(), "cpus is not a run flag") {
		t.Errorf("cpus: %v", err)
	}
	if _, err := RunResolver(context.Background(), "/nonexistent/pstrain")(map[string]string{}); err == nil || !strings.Contains(err.Error(), "/nonexistent/pstrain") {
		t.Errorf("a missing binary: %v", err)
	}
}

func TestParseDryRun(t *testing.T) {
	p, err := parseDryRun("--mode=sync\n--workers=2\n--checkpoint-dir=run/checkpoints\n")
	if err != nil || p["mode"] != "sync" || p["workers"] != "2" || p["model"] != "mlp" || len(p) != 3 {
		t.Errorf("got %v, %v", p, err)
	}
	if _, err := parseDryRun("training started\n"); err == nil {
		t.Error("output without flags accepted")
	}
}
