package launcher

import (
	"slices"
	"testing"
)

func TestTaskEnvSharesTheCores(t *testing.T) {
	base := []string{"HOME=/root", "PATH=/bin"}
	for _, c := range []struct {
		ncpu, tasks int
		want        string
	}{
		{2, 5, "GOMAXPROCS=1"},  // the default cluster on this machine
		{2, 2, "GOMAXPROCS=1"},  // a core each
		{16, 5, "GOMAXPROCS=3"}, // a larger host: the share, rounded down
		{64, 1, "GOMAXPROCS=64"},
		{1, 0, "GOMAXPROCS=1"}, // never below 1, nor a division by 0
	} {
		env := taskEnv(base, c.ncpu, c.tasks)
		if !slices.Contains(env, c.want) || !slices.Contains(env, "OPENBLAS_NUM_THREADS=1") {
			t.Errorf("taskEnv(%d cpus, %d tasks) = %q, want %s and OPENBLAS_NUM_THREADS=1", c.ncpu, c.tasks, env, c.want)
		}
		if !slices.Equal(env[:len(base)], base) {
			t.Errorf("taskEnv dropped or reordered the launcher's environment: %q", env)
		}
	}
}

func TestTaskEnvKeepsTheUsersGOMAXPROCS(t *testing.T) {
	base := []string{"GOMAXPROCS=2", "HOME=/root"}
	env := taskEnv(base, 2, 5)
	n := 0
	for _, kv := range env {
		if len(kv) > 11 && kv[:11] == "GOMAXPROCS=" {
			n++
		}
	}
	if n != 1 || !slices.Contains(env, "GOMAXPROCS=2") {
		t.Errorf("taskEnv overrode the user's GOMAXPROCS: %q", env)
	}
	base[0] = "changed"
	if env[0] != "GOMAXPROCS=2" {
		t.Error("taskEnv shares the caller's slice")
	}
}
