package checkpoint

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// ckptBytes is the file data one checkpoint of step with numShards
// shards takes (shards and manifest), measured on a scratch MemFS.
func ckptBytes(t *testing.T, step int64, numShards int) int64 {
	t.Helper()
	m := NewMemFS()
	saveCheckpoint(t, NewStore(m, testDir, 0), step, numShards)
	return m.Used()
}

func dirNames(t *testing.T, m *MemFS) string {
	t.Helper()
	return strings.Join(listSteps(t, m, testDir), " ")
}

func TestMemFSCapacity(t *testing.T) {
	m := NewMemFS()
	m.SetCapacity(10)
	f, err := m.Create("/a", 0o600)
	mustNo(t, err)
	n, err := f.Write([]byte("0123456789abc"))
	if n != 10 || !errors.Is(err, syscall.ENOSPC) || !IsDiskFull(err) {
		t.Fatalf("write past the capacity: %d, %v; want 10 bytes and ENOSPC", n, err)
	}
	mustNo(t, f.Close())
	if m.Used() != 10 {
		t.Fatalf("used %d, want 10", m.Used())
	}
	mustNo(t, m.Remove("/a"))
	writeFile(t, m, "/b", "0123456789", true) // the space is back
}

// A full disk while a shard is written: the older checkpoints go (the
// newest stays) and the write is retried once, successfully.
func TestFullDiskFreesOlderCheckpoints(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	for step := int64(1); step <= 3; step++ {
		saveCheckpoint(t, s, step, 2)
	}
	// Room for half a checkpoint more: step 4 needs the space of 1 and 2.
	m.SetCapacity(m.Used() + ckptBytes(t, 4, 2)/2)
	saveCheckpoint(t, s, 4, 2)
	if got, want := dirNames(t, m), "ckpt-000000000003 ckpt-000000000004"; got != want {
		t.Fatalf("after the full disk: %s, want %s", got, want)
	}
	checkLoads(t, s, s.Path(3), 3)
	checkLoads(t, s, s.Path(4), 4)
}

// The manifest is what does not fit: Commit frees space the same way.
func TestFullDiskAtCommit(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	saveCheckpoint(t, s, 1, 1)
	saveCheckpoint(t, s, 2, 1)
	infos, err := writeShards(s, 3, 1)
	mustNo(t, err)
	m.SetCapacity(m.Used() + 10) // no room for a manifest
	mustNo(t, s.Commit(testManifest(3, infos)))
	if got, want := dirNames(t, m), "ckpt-000000000002 ckpt-000000000003"; got != want {
		t.Fatalf("after the full disk: %s, want %s", got, want)
	}
	checkLoads(t, s, s.Path(3), 3)
}

// Freeing space never deletes the newest valid checkpoint, nor a damaged
// newer one, nor the temporary directory being written; it deletes
// leftovers of other steps. When that is not enough the error says so
// and is still a full disk.
func TestFullDiskKeepsNewestValid(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	for step := int64(1); step <= 3; step++ {
		saveCheckpoint(t, s, step, 2)
	}
	corruptions()[0].damage(t, m, s.Path(3)) // step 3: a flipped byte, same size
	_, err := s.WriteShard(7, 0, 2, shardTensors(7, 0), nil)
	mustNo(t, err) // a leftover of an abandoned attempt
	_, err = s.WriteShard(9, 0, 2, shardTensors(9, 0), nil)
	mustNo(t, err) // shard 0 of the checkpoint being written
	m.SetCapacity(m.Used() + 16)
	// A shard larger than all that can be freed.
	big := detTensors(9, 200, 60)

	_, err = s.WriteShard(9, 1, 2, big, nil)
	if !IsDiskFull(err) || !strings.Contains(err.Error(), "retried once, after deleting ckpt-000000000001, ckpt-000000000007.tmp") {
		t.Fatalf("shard 1 on a disk that cannot hold it: %v; want ENOSPC naming what was deleted", err)
	}
	if got, want := dirNames(t, m), "ckpt-000000000002 ckpt-000000000003 ckpt-000000000009.tmp"; got != want {
		t.Fatalf("after freeing space: %s, want %s", got, want)
	}
	latest, _, err := s.Latest()
	if err != nil || latest.Step != 2 {
		t.Fatalf("Latest = %+v, %v; want step 2, which was kept", latest, err)
	}
	if _, ok := fileContents(t, m, filepath.Join(s.tmpPath(9), ShardFileName(0, 2))); !ok {
		t.Fatal("the other shard's file of the checkpoint being written was deleted")
	}

	// Nothing left to delete: the error says so.
	_, err = s.WriteShard(9, 1, 2, big, nil)
	if !IsDiskFull(err) || !strings.Contains(err.Error(), "nothing older than the newest valid checkpoint was left to delete") {
		t.Fatalf("second attempt: %v", err)
	}
}

// With no valid checkpoint at all, none is deleted to make room.
func TestFullDiskWithoutValidCheckpointDeletesNone(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	saveCheckpoint(t, s, 1, 2)
	saveCheckpoint(t, s, 2, 2)
	corruptions()[0].damage(t, m, s.Path(1))
	corruptions()[0].damage(t, m, s.Path(2))
	m.SetCapacity(m.Used() + 16)
	if _, err := s.WriteShard(3, 0, 2, shardTensors(3, 0), nil); !IsDiskFull(err) {
		t.Fatalf("WriteShard = %v, want a full disk", err)
	}
	if got, want := dirNames(t, m), "ckpt-000000000001 ckpt-000000000002 ckpt-000000000003.tmp"; got != want {
		t.Fatalf("after the failed write: %s, want %s", got, want)
	}
}

// Every shard writer (one per PS process) frees space when the disk is
// full, concurrently: each retries and both shards are written.
func TestFullDiskConcurrentWriters(t *testing.T) {
	for i := range 20 {
		m := NewMemFS()
		s := NewStore(m, testDir, 0)
		for step := int64(1); step <= 4; step++ {
			saveCheckpoint(t, s, step, 2)
		}
		m.SetCapacity(m.Used() + 64)
		// Two stores, as two processes have.
		a, b := NewStore(m, testDir, 0), NewStore(m, testDir, 0)
		infos := make([]ShardInfo, 2)
		errs := make([]error, 2)
		done := make(chan struct{}, 2)
		for k, st := range []*Store{a, b} {
			go func() {
				infos[k], errs[k] = st.WriteShard(5, k, 2, shardTensors(5, k), map[string]string{"step": "5"})
				done <- struct{}{}
			}()
		}
		<-done
		<-done
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		mustNo(t, s.Commit(testManifest(5, infos)))
		if got, want := dirNames(t, m), "ckpt-000000000004 ckpt-000000000005"; got != want {
			t.Fatalf("round %d: %s, want %s", i, got, want)
		}
		checkLoads(t, s, s.Path(5), 5)
	}
}

func TestRemoveTemporaries(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	if got, err := s.RemoveTemporaries(); err != nil || len(got) != 0 {
		t.Fatalf("on a missing directory: %v, %v", got, err)
	}
	saveCheckpoint(t, s, 1, 2)
	for _, step := range []int64{2, 3} {
		_, err := s.WriteShard(step, 0, 2, shardTensors(step, 0), nil)
		mustNo(t, err)
	}
	writeFile(t, m, filepath.Join(s.tmpPath(3), ".shard-1-of-2.safetensors.tmp-dead"), "partial", false)
	mustNo(t, m.MkdirAll(filepath.Join(testDir, DirName(1)+".trash", "x"), 0o755))
	mustNo(t, m.MkdirAll(filepath.Join(testDir, ArchiveName(testCreated())), 0o755))
	writeFile(t, m, filepath.Join(testDir, "notes.txt"), "mine", false)

	got, err := s.RemoveTemporaries()
	mustNo(t, err)
	if want := "ckpt-000000000001.trash ckpt-000000000002.tmp ckpt-000000000003.tmp"; strings.Join(got, " ") != want {
		t.Fatalf("removed %v, want %s", got, want)
	}
	if got, want := dirNames(t, m), fmt.Sprintf("%s ckpt-000000000001 notes.txt", ArchiveName(testCreated())); got != want {
		t.Fatalf("left %s, want %s", got, want)
	}
	checkLoads(t, s, s.Path(1), 1)
}

func TestLatestAllDamaged(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	saveCheckpoint(t, s, 9, 2)
	saveCheckpoint(t, s, 10, 2)
	corruptions()[0].damage(t, m, s.Path(10))
	mustNo(t, m.Remove(filepath.Join(s.Path(9), ManifestName)))
	_, skipped, err := s.Latest()
	if !errors.Is(err, ErrAllDamaged) || !errors.Is(err, ErrNoCheckpoint) || len(skipped) != 2 {
		t.Fatalf("Latest = %v, skipped %d; want ErrAllDamaged and ErrNoCheckpoint", err, len(skipped))
	}
	for _, want := range []string{"ckpt-000000000010 (", "SHA-256", "ckpt-000000000009 (", "MANIFEST.json"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// An empty directory is not damaged.
	if _, _, err := NewStore(m, "/elsewhere", 0).Latest(); errors.Is(err, ErrAllDamaged) || !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty store: %v", err)
	}
}
