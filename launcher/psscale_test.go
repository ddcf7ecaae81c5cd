package launcher

import (
	"strings"
	"testing"

	"github.com/pstrain/pstrain/config"
)

// TestPSRefusal: the runs whose PS count cannot change say why before a
// process starts; a run with checkpoints can, in every mode, with hot
// standbys or without.
func TestPSRefusal(t *testing.T) {
	ok := config.Default()
	ok.CheckpointDir = "ck"
	for _, mode := range []config.Mode{config.Sync, config.Async, config.SSP} {
		for _, replicas := range []int{0, 1} {
			r := ok
			r.Mode, r.PSReplicas = mode, replicas
			if why := psRefusal(r); why != "" {
				t.Fatalf("a %s run with checkpoints and --ps-replicas %d refused: %s", mode, replicas, why)
			}
		}
	}
	for _, c := range []struct {
		change func(*config.Run)
		want   string
	}{
		{func(r *config.Run) { r.Model = config.ModelKind("ctr") }, "embedding tables"},
		{func(r *config.Run) { r.CheckpointDir = "" }, "--checkpoint-dir"},
	} {
		r := ok
		c.change(&r)
		if why := psRefusal(r); !strings.Contains(why, c.want) {
			t.Errorf("refusal %q, want one naming %q", why, c.want)
		}
	}
}
