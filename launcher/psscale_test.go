package launcher

import (
	"strings"
	"testing"

	"github.com/pstrain/pstrain/config"
)

// TestPSRefusal: the runs whose PS count cannot change say why before a
// process starts; a sync run with checkpoints can.
func TestPSRefusal(t *testing.T) {
	ok := config.Default()
	ok.CheckpointDir = "ck"
	if why := psRefusal(ok); why != "" {
		t.Fatalf("a sync run with checkpoints refused: %s", why)
	}
	for _, c := range []struct {
		change func(*config.Run)
		want   string
	}{
		{func(r *config.Run) { r.Mode = config.Async }, "sync only"},
		{func(r *config.Run) { r.PSReplicas = 1 }, "hot standbys"},
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
