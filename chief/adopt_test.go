package chief

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/pstrain/pstrain/checkpoint"
)

// TestNewestCommitted: a restarted chief's Adoption.Committed is the
// store's newest checkpoint that passes the cheap checks (one missing a
// shard file is passed over), and -1 without a store or checkpoints.
func TestNewestCommitted(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if got := (&Chief{cfg: Config{Log: log}}).newestCommitted(); got != -1 {
		t.Fatalf("without a store: %d, want -1", got)
	}
	fsys := checkpoint.NewMemFS()
	store := checkpoint.NewStore(fsys, "ck", 0)
	c := &Chief{cfg: Config{Log: log, Store: store}}
	if got := c.newestCommitted(); got != -1 {
		t.Fatalf("an empty store: %d, want -1", got)
	}
	for _, step := range []int64{5, 9} {
		info, err := store.WriteShard(step, 0, 1, []checkpoint.Tensor{{Name: "w", Shape: []int{2}, Data: []float32{1, 2}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		m := checkpoint.Manifest{Step: step, Version: step, Mode: "sync", NumShards: 1, Shards: []checkpoint.ShardInfo{info}}
		if err := store.Commit(m); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.newestCommitted(); got != 9 {
		t.Fatalf("checkpoints of steps 5 and 9: %d, want 9", got)
	}
	if err := fsys.Remove(filepath.Join(store.Path(9), checkpoint.ShardFileName(0, 1))); err != nil {
		t.Fatal(err)
	}
	if got := c.newestCommitted(); got != 5 {
		t.Fatalf("step 9's shard file gone: %d, want 5", got)
	}
}
