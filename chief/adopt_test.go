package chief

import (
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/checkpoint"
)

// TestCommittedSteps: a restarted chief's Adoption.Committed are the
// store's checkpoints that pass the cheap checks (one missing a shard
// file is passed over), newest first; none without a store or
// checkpoints.
func TestCommittedSteps(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if got := (&Chief{cfg: Config{Log: log}}).committedSteps(); got != nil {
		t.Fatalf("without a store: %v, want none", got)
	}
	fsys := checkpoint.NewMemFS()
	store := checkpoint.NewStore(fsys, "ck", 0)
	c := &Chief{cfg: Config{Log: log, Store: store}}
	if got := c.committedSteps(); got != nil {
		t.Fatalf("an empty store: %v, want none", got)
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
	if got := c.committedSteps(); !slices.Equal(got, []int64{9, 5}) {
		t.Fatalf("checkpoints of steps 5 and 9: %v, want [9 5]", got)
	}
	if err := fsys.Remove(filepath.Join(store.Path(9), checkpoint.ShardFileName(0, 1))); err != nil {
		t.Fatal(err)
	}
	if got := c.committedSteps(); !slices.Equal(got, []int64{5}) {
		t.Fatalf("step 9's shard file gone: %v, want [5]", got)
	}
}
