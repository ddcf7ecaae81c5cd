package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const testDir = "/data/ckpt"

func testCreated() time.Time { return time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC) }

func shardTensors(step int64, shard int) []Tensor {
	ts := detTensors(int(step)*10+shard, 4, 6)
	for i := range ts {
		ts[i].Name = fmt.Sprintf("s%d/%s", shard, ts[i].Name)
	}
	return ts
}

func testManifest(step int64, shards []ShardInfo) Manifest {
	return Manifest{
		Step:      step,
		Version:   step + 1,
		Mode:      "sync",
		Created:   testCreated(),
		ModelSpec: json.RawMessage(`{"layers": [784, 256, 10]}`),
		RunConfig: json.RawMessage(`{"lr":0.01,"workers":2}`),
		Optimizer: Optimizer{Name: "adam", Hyperparams: map[string]float64{"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}},
		Shards:    shards,
	}
}

// writeShards writes every shard of step, concurrently as separate PS
// processes would.
func writeShards(s *Store, step int64, numShards int) ([]ShardInfo, error) {
	infos := make([]ShardInfo, numShards)
	errs := make([]error, numShards)
	var wg sync.WaitGroup
	for i := range numShards {
		wg.Go(func() {
			infos[i], errs[i] = s.WriteShard(step, i, numShards, shardTensors(step, i), map[string]string{"step": fmt.Sprint(step)})
		})
	}
	wg.Wait()
	return infos, errors.Join(errs...)
}

// writeShardsSeq is writeShards in a fixed order, for operation counting.
func writeShardsSeq(s *Store, step int64, numShards int) ([]ShardInfo, error) {
	infos := make([]ShardInfo, numShards)
	for i := range numShards {
		var err error
		infos[i], err = s.WriteShard(step, i, numShards, shardTensors(step, i), map[string]string{"step": fmt.Sprint(step)})
		if err != nil {
			return nil, err
		}
	}
	return infos, nil
}

func saveCheckpoint(t *testing.T, s *Store, step int64, numShards int) Manifest {
	t.Helper()
	infos, err := writeShards(s, step, numShards)
	if err != nil {
		t.Fatal(err)
	}
	m := testManifest(step, infos)
	if err := s.Commit(m); err != nil {
		t.Fatal(err)
	}
	return m
}

// checkLoads loads the checkpoint at path and compares every shard with
// what was written for step.
func checkLoads(t *testing.T, s *Store, path string, step int64) {
	t.Helper()
	c, err := s.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Manifest.Step != step {
		t.Fatalf("manifest step %d, want %d", c.Manifest.Step, step)
	}
	for i := range c.Manifest.Shards {
		got, meta, err := c.ReadShard(i)
		if err != nil {
			t.Fatal(err)
		}
		tensorsEqual(t, got, shardTensors(step, i))
		if meta["step"] != fmt.Sprint(step) {
			t.Fatalf("shard %d meta %v", i, meta)
		}
	}
}

func listSteps(t *testing.T, fsys FS, dir string) []string {
	t.Helper()
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestStoreRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		fs   FS
		dir  string
	}{
		{"memfs", NewMemFS(), testDir},
		{"osfs", OSFS{}, filepath.Join(t.TempDir(), "nested", "ckpt")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(tc.fs, tc.dir, 3)
			if _, _, err := s.Latest(); !errors.Is(err, ErrNoCheckpoint) {
				t.Fatalf("Latest on empty store: %v", err)
			}
			want := saveCheckpoint(t, s, 7, 3)

			if got := listSteps(t, tc.fs, tc.dir); len(got) != 1 || got[0] != "ckpt-000000000007" {
				t.Fatalf("directory holds %v", got)
			}
			files := listSteps(t, tc.fs, s.Path(7))
			wantFiles := []string{ManifestName, "shard-0-of-3.safetensors", "shard-1-of-3.safetensors", "shard-2-of-3.safetensors"}
			if strings.Join(files, ",") != strings.Join(wantFiles, ",") {
				t.Fatalf("checkpoint holds %v, want %v", files, wantFiles)
			}

			latest, skipped, err := s.Latest()
			if err != nil || len(skipped) != 0 {
				t.Fatalf("Latest: %v %v", err, skipped)
			}
			if latest.Step != 7 || latest.Path != s.Path(7) || latest.Manifest == nil {
				t.Fatalf("Latest = %+v", latest)
			}
			m := latest.Manifest
			if m.FormatVersion != FormatVersion || m.NumShards != 3 || m.Mode != "sync" || m.Version != 8 ||
				!m.Created.Equal(testCreated()) || m.Optimizer.Hyperparams["beta2"] != 0.999 || m.Optimizer.Name != "adam" {
				t.Fatalf("manifest = %+v", m)
			}
			var spec struct{ Layers []int }
			if err := json.Unmarshal(m.ModelSpec, &spec); err != nil || len(spec.Layers) != 3 {
				t.Fatalf("model spec %s: %v", m.ModelSpec, err)
			}
			for i, sh := range m.Shards {
				if sh.Index != i || sh.SHA256 != want.Shards[i].SHA256 || len(sh.Tensors) != 5 {
					t.Fatalf("shard %d = %+v", i, sh)
				}
			}
			if err := s.Verify(latest.Path); err != nil {
				t.Fatal(err)
			}
			checkLoads(t, s, latest.Path, 7)
		})
	}
}

func TestCommitRejectsBadShards(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 2)
	infos, err := writeShards(s, 5, 2)
	mustNo(t, err)
	tmp := filepath.Join(testDir, DirName(5)+".tmp")

	// Hash mismatch: same size, different bytes.
	bad := append([]ShardInfo(nil), infos...)
	bad[1].SHA256 = strings.Repeat("0", 64)
	if err := s.Commit(testManifest(5, bad)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("hash mismatch: err = %v, want ErrCorrupt", err)
	}
	// Size mismatch.
	bad = append([]ShardInfo(nil), infos...)
	bad[0].Bytes++
	if err := s.Commit(testManifest(5, bad)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("size mismatch: err = %v, want ErrCorrupt", err)
	}
	// File changed on disk after it was written.
	orig, _ := fileContents(t, m, filepath.Join(tmp, infos[0].File))
	flipped := []byte(orig)
	flipped[len(flipped)-1] ^= 1
	writeFile(t, m, filepath.Join(tmp, infos[0].File), string(flipped), true)
	if err := s.Commit(testManifest(5, infos)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("modified shard: err = %v, want ErrCorrupt", err)
	}
	writeFile(t, m, filepath.Join(tmp, infos[0].File), orig, true)
	// Missing shard in the manifest, duplicate index, wrong name.
	for name, shards := range map[string][]ShardInfo{
		"missing":   infos[:1],
		"duplicate": {infos[0], infos[0]},
		"renamed":   {infos[0], {Index: 1, File: "../evil", SHA256: infos[1].SHA256, Bytes: infos[1].Bytes}},
		"none":      nil,
	} {
		mm := testManifest(5, shards)
		if name == "missing" {
			mm.NumShards = 2
		}
		if err := s.Commit(mm); err == nil {
			t.Fatalf("%s: Commit succeeded", name)
		}
	}
	// A file that was never written.
	if err := s.Commit(testManifest(6, infos)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("uncommitted step: err = %v, want ErrNotExist", err)
	}
	// Nothing above committed anything.
	if infos, _ := s.List(); len(infos) != 0 {
		t.Fatalf("List = %+v", infos)
	}
	// Shards given out of order are fine; committing twice is not.
	mustNo(t, s.Commit(testManifest(5, []ShardInfo{infos[1], infos[0]})))
	if err := s.Commit(testManifest(5, infos)); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second commit: err = %v, want ErrExist", err)
	}
	if _, err := s.WriteShard(5, 0, 2, shardTensors(5, 0), nil); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("WriteShard after commit: err = %v, want ErrExist", err)
	}
	checkLoads(t, s, s.Path(5), 5)
}

func TestCommitRemovesStrayFiles(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 2)
	infos, err := writeShards(s, 3, 2)
	mustNo(t, err)
	tmp := filepath.Join(testDir, DirName(3)+".tmp")
	writeFile(t, m, filepath.Join(tmp, ".shard-0-of-2.safetensors.tmp-dead"), "partial", false)
	writeFile(t, m, filepath.Join(tmp, "shard-0-of-4.safetensors"), "other layout", false)
	mustNo(t, s.Commit(testManifest(3, infos)))
	files := listSteps(t, m, s.Path(3))
	if len(files) != 3 {
		t.Fatalf("checkpoint holds %v", files)
	}
}

type corruption struct {
	name      string
	listSees  bool
	damage    func(t *testing.T, m *MemFS, path string)
	wantError error
}

// corruptions damage a committed checkpoint in ways that List (size only)
// may or may not see, and that Verify must see.
func corruptions() []corruption {
	return []corruption{
		{"flipped shard byte", false, func(t *testing.T, m *MemFS, path string) {
			name := filepath.Join(path, "shard-1-of-2.safetensors")
			b, _ := fileContents(t, m, name)
			bb := []byte(b)
			bb[len(bb)/2] ^= 0x40
			writeFile(t, m, name, string(bb), true)
		}, ErrCorrupt},
		{"truncated shard", true, func(t *testing.T, m *MemFS, path string) {
			name := filepath.Join(path, "shard-0-of-2.safetensors")
			b, _ := fileContents(t, m, name)
			writeFile(t, m, name, b[:len(b)-4], true)
		}, ErrCorrupt},
		{"missing shard", true, func(t *testing.T, m *MemFS, path string) {
			mustNo(t, m.Remove(filepath.Join(path, "shard-0-of-2.safetensors")))
		}, fs.ErrNotExist},
		{"missing manifest", true, func(t *testing.T, m *MemFS, path string) {
			mustNo(t, m.Remove(filepath.Join(path, ManifestName)))
		}, fs.ErrNotExist},
		{"edited manifest", true, func(t *testing.T, m *MemFS, path string) {
			name := filepath.Join(path, ManifestName)
			b, _ := fileContents(t, m, name)
			writeFile(t, m, name, strings.Replace(b, `"version": 11`, `"version": 12`, 1), true)
		}, ErrCorrupt},
		{"truncated manifest", true, func(t *testing.T, m *MemFS, path string) {
			name := filepath.Join(path, ManifestName)
			b, _ := fileContents(t, m, name)
			writeFile(t, m, name, b[:len(b)/2], true)
		}, ErrCorrupt},
		{"manifest of another step", true, func(t *testing.T, m *MemFS, path string) {
			b, _ := fileContents(t, m, filepath.Join(filepath.Dir(path), DirName(9), ManifestName))
			writeFile(t, m, filepath.Join(path, ManifestName), b, true)
		}, ErrCorrupt},
	}
}

func TestLatestSkipsCorruptNewest(t *testing.T) {
	for _, c := range corruptions() {
		t.Run(c.name, func(t *testing.T) {
			m := NewMemFS()
			s := NewStore(m, testDir, 0)
			saveCheckpoint(t, s, 9, 2)
			saveCheckpoint(t, s, 10, 2)
			c.damage(t, m, s.Path(10))

			infos, err := s.List()
			mustNo(t, err)
			if len(infos) != 2 || infos[0].Step != 10 || infos[1].Step != 9 {
				t.Fatalf("List = %+v", infos)
			}
			if got := infos[0].Err != nil; got != c.listSees {
				t.Fatalf("List error for step 10 = %v, want error: %v", infos[0].Err, c.listSees)
			}
			if err := s.Verify(s.Path(10)); !errors.Is(err, c.wantError) {
				t.Fatalf("Verify = %v, want %v", err, c.wantError)
			}
			latest, skipped, err := s.Latest()
			mustNo(t, err)
			if latest.Step != 9 {
				t.Fatalf("Latest = step %d, want 9", latest.Step)
			}
			if len(skipped) != 1 || skipped[0].Step != 10 || !errors.Is(skipped[0].Err, c.wantError) {
				t.Fatalf("skipped = %+v", skipped)
			}
			checkLoads(t, s, latest.Path, 9)

			// Reading the damaged checkpoint fails cleanly too.
			if ck, err := s.Load(s.Path(10)); err == nil {
				var rerr error
				for i := range ck.Manifest.Shards {
					if _, _, err := ck.ReadShard(i); err != nil {
						rerr = err
					}
				}
				if !errors.Is(rerr, c.wantError) {
					t.Fatalf("ReadShard of damaged checkpoint: %v, want %v", rerr, c.wantError)
				}
			}
		})
	}
}

func TestLatestNoValidCheckpoint(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	saveCheckpoint(t, s, 1, 1)
	mustNo(t, m.Remove(filepath.Join(s.Path(1), "shard-0-of-1.safetensors")))
	// Junk the store must ignore.
	mustNo(t, m.MkdirAll(filepath.Join(testDir, "ckpt-12"), 0o755))
	mustNo(t, m.MkdirAll(filepath.Join(testDir, "ckpt-0000000000x1"), 0o755))
	writeFile(t, m, filepath.Join(testDir, "ckpt-000000000002"), "a file", false)
	_, skipped, err := s.Latest()
	if !errors.Is(err, ErrNoCheckpoint) || len(skipped) != 1 {
		t.Fatalf("Latest: %v, skipped %+v", err, skipped)
	}
}

func TestRetention(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 2)
	for step := int64(1); step <= 5; step++ {
		saveCheckpoint(t, s, step, 2)
	}
	// Leftovers: an abandoned older temporary directory, a newer one
	// in progress, and an interrupted deletion.
	_, err := s.WriteShard(3, 0, 2, shardTensors(3, 0), nil)
	mustNo(t, err)
	mustNo(t, m.MkdirAll(filepath.Join(testDir, DirName(2)+".tmp"), 0o755))
	mustNo(t, m.MkdirAll(filepath.Join(testDir, DirName(1)+".trash"), 0o755))
	_, err = s.WriteShard(8, 0, 2, shardTensors(8, 0), nil)
	mustNo(t, err)

	saveCheckpoint(t, s, 6, 2)
	got := strings.Join(listSteps(t, m, testDir), " ")
	want := "ckpt-000000000005 ckpt-000000000006 ckpt-000000000008.tmp"
	if got != want {
		t.Fatalf("after retention: %s, want %s", got, want)
	}
	for _, step := range []int64{5, 6} {
		mustNo(t, s.Verify(s.Path(step)))
	}

	// A corrupt checkpoint does not count toward keep: the older valid
	// one is kept instead and the corrupt one goes.
	saveCheckpoint(t, s, 7, 2)
	mustNo(t, m.Remove(filepath.Join(s.Path(7), ManifestName)))
	mustNo(t, m.MkdirAll(filepath.Join(testDir, DirName(9)+".tmp"), 0o755))
	infos, err := writeShards(s, 9, 2)
	mustNo(t, err)
	mustNo(t, s.Commit(testManifest(9, infos)))
	got = strings.Join(listSteps(t, m, testDir), " ")
	want = "ckpt-000000000006 ckpt-000000000009"
	if got != want {
		t.Fatalf("after retention with a corrupt checkpoint: %s, want %s", got, want)
	}
}

// Retention keeps the newest valid checkpoint at or before the step a
// rollback may go back to, beyond the keep newest: otherwise a run whose
// newer checkpoints all hold a diverged model could only restart from its
// initial weights.
func TestRetentionKeepsTheKnownGood(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 3)
	commit := func(step, good int64) string {
		t.Helper()
		infos, err := writeShards(s, step, 2)
		mustNo(t, err)
		mustNo(t, s.CommitKeeping(testManifest(step, infos), good))
		return strings.Join(listSteps(t, m, testDir), " ")
	}
	saveCheckpoint(t, s, 10, 2)
	commit(20, 15)
	if got, want := commit(30, 15), "ckpt-000000000010 ckpt-000000000020 ckpt-000000000030"; got != want {
		t.Fatalf("three of three: %s, want %s", got, want)
	}
	// The two newest, and the last slot for 10, the newest at or before 15.
	if got, want := commit(40, 15), "ckpt-000000000010 ckpt-000000000030 ckpt-000000000040"; got != want {
		t.Fatalf("keeping the newest at or before 15: %s, want %s", got, want)
	}
	// The known good among the newest: plain retention.
	if got, want := commit(50, 45), "ckpt-000000000030 ckpt-000000000040 ckpt-000000000050"; got != want {
		t.Fatalf("the known good among the newest: %s, want %s", got, want)
	}
	// A corrupt candidate is not kept for it: the next older valid one is.
	commit(60, 45)
	mustNo(t, m.Remove(filepath.Join(s.Path(50), ManifestName)))
	if got, want := commit(70, 55), "ckpt-000000000040 ckpt-000000000060 ckpt-000000000070"; got != want {
		t.Fatalf("past a corrupt candidate: %s, want %s", got, want)
	}
	// -1: plain retention.
	if got, want := commit(80, -1), "ckpt-000000000060 ckpt-000000000070 ckpt-000000000080"; got != want {
		t.Fatalf("without a known good: %s, want %s", got, want)
	}
	// keep 1 is one checkpoint, known good or not.
	one := NewStore(m, testDir, 1)
	infos, err := writeShards(one, 90, 2)
	mustNo(t, err)
	mustNo(t, one.CommitKeeping(testManifest(90, infos), 65))
	if got, want := strings.Join(listSteps(t, m, testDir), " "), "ckpt-000000000090"; got != want {
		t.Fatalf("keep 1: %s, want %s", got, want)
	}
}

// The previous checkpoint must not be touched until the new one is
// committed: check the order of operations.
func TestRetentionOnlyAfterCommit(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 1)
	saveCheckpoint(t, s, 1, 2)
	f := NewFaultFS(m, -1, false)
	s2 := NewStore(f, testDir, 1)
	saveCheckpoint(t, s2, 2, 2)
	ops := f.Ops()
	commitAt, syncAt, firstTouch := -1, -1, -1
	old := s.Path(1)
	for i, op := range ops {
		switch {
		case op == "rename "+s.tmpPath(2)+" -> "+s.Path(2):
			commitAt = i
		case commitAt >= 0 && syncAt < 0 && op == "syncdir "+testDir:
			syncAt = i
		case firstTouch < 0 && strings.Contains(op, old) && !strings.HasPrefix(op, "stat ") &&
			!strings.HasPrefix(op, "open ") && !strings.HasPrefix(op, "fstat ") &&
			!strings.HasPrefix(op, "readat ") && !strings.HasPrefix(op, "close "):
			firstTouch = i
		}
	}
	if commitAt < 0 || syncAt < 0 || firstTouch < 0 {
		t.Fatalf("commit %d, sync %d, first change of the old checkpoint %d in\n%s", commitAt, syncAt, firstTouch, strings.Join(ops, "\n"))
	}
	if firstTouch < syncAt {
		t.Fatalf("old checkpoint changed at op %d (%s) before the commit was durable at op %d", firstTouch, ops[firstTouch], syncAt)
	}
	if got := strings.Join(listSteps(t, m, testDir), " "); got != "ckpt-000000000002" {
		t.Fatalf("directory holds %s", got)
	}
}

// Every operation of a checkpoint write may fail (an I/O error, not a
// crash): the previous checkpoint stays the valid latest, and a retry on
// the same filesystem succeeds.
func TestFailAtEveryOperation(t *testing.T) {
	total := -1
	for k := 0; total < 0 || k <= total; k++ {
		m := NewMemFS()
		base := NewStore(m, testDir, 1)
		saveCheckpoint(t, base, 100, 2)
		f := NewFaultFS(m, k, false)
		s := NewStore(f, testDir, 1)
		infos, err := writeShardsSeq(s, 200, 2)
		if err == nil {
			err = s.Commit(testManifest(200, infos))
		}
		if !f.Triggered() {
			if err != nil {
				t.Fatalf("no fault injected at %d, but: %v", k, err)
			}
			total = k
			continue
		}
		latest, _, lerr := base.Latest()
		if lerr != nil {
			t.Fatalf("fail at op %d (%s): Latest: %v", k, f.Ops()[k], lerr)
		}
		// A failed write leaves the old checkpoint as the latest,
		// except when only the final fsync of DIR failed: the rename
		// happened, so the new one is visible (but its durability is
		// unknown).
		switch {
		case err == nil || errors.Is(err, ErrRetention):
			if latest.Step != 200 {
				t.Fatalf("fail at op %d (%s): commit reported success (%v) but Latest = %d", k, f.Ops()[k], err, latest.Step)
			}
		case latest.Step != 100 && f.Ops()[k] != "syncdir "+testDir:
			t.Fatalf("fail at op %d (%s): commit failed (%v) but Latest = %d", k, f.Ops()[k], err, latest.Step)
		}
		if latest.Step == 100 {
			infos, err := writeShardsSeq(base, 200, 2)
			if err == nil {
				err = base.Commit(testManifest(200, infos))
			}
			if err != nil {
				t.Fatalf("fail at op %d (%s): retry: %v", k, f.Ops()[k], err)
			}
		}
		if latest, _, err := base.Latest(); err != nil || latest.Step != 200 {
			t.Fatalf("fail at op %d: after retry Latest = %+v, %v", k, latest, err)
		}
		checkLoads(t, base, base.Path(200), 200)
	}
	if total < 10 {
		t.Fatalf("only %d operations", total)
	}
}

func TestManifestChecksumDetectsEveryByteFlip(t *testing.T) {
	m := testManifest(42, []ShardInfo{{Index: 0, File: ShardFileName(0, 1), SHA256: strings.Repeat("ab", 32), Bytes: 1234, Tensors: []string{"w", "w/m"}}})
	m.FormatVersion = FormatVersion
	m.NumShards = 1
	data, err := EncodeManifest(m)
	mustNo(t, err)
	got, err := DecodeManifest(data)
	mustNo(t, err)
	if got.Step != 42 || got.Checksum == "" || got.Shards[0].Tensors[1] != "w/m" {
		t.Fatalf("decoded %+v", got)
	}
	again, err := EncodeManifest(got)
	mustNo(t, err)
	if string(again) != string(data) {
		t.Fatalf("re-encoding differs:\n%s\n%s", data, again)
	}
	for i := range data {
		for _, bit := range []byte{0x01, 0x20, 0x80} {
			b := append([]byte(nil), data...)
			b[i] ^= bit
			if _, err := DecodeManifest(b); err == nil {
				// Changes that do not alter the decoded content
				// (letter case of a key, whitespace) are harmless.
				if !harmless(t, data, b) {
					t.Fatalf("flipping bit %#x of byte %d (%q) went undetected", bit, i, data[i])
				}
			}
		}
	}
}

// harmless reports whether b decodes to the same manifest as orig.
func harmless(t *testing.T, orig, b []byte) bool {
	t.Helper()
	var x, y Manifest
	if json.Unmarshal(orig, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ex, _ := EncodeManifest(x)
	ey, _ := EncodeManifest(y)
	return string(ex) == string(ey)
}

// TestMarkFinal: the newest checkpoint is marked final only when it holds
// the shards' final versions, and a fault at any step of the rewrite
// leaves a checkpoint that verifies, final or not.
func TestMarkFinal(t *testing.T) {
	commit := func(t *testing.T, s *Store) {
		t.Helper()
		infos, err := writeShards(s, 7, 2)
		if err != nil {
			t.Fatal(err)
		}
		for i := range infos {
			infos[i].Version = 7
		}
		if err := s.Commit(testManifest(7, infos)); err != nil {
			t.Fatal(err)
		}
	}
	final := func(t *testing.T, s *Store) bool {
		t.Helper()
		if err := s.Verify(s.Path(7)); err != nil {
			t.Fatal(err)
		}
		c, err := s.Load(s.Path(7))
		if err != nil {
			t.Fatal(err)
		}
		return c.Manifest.Final
	}
	s := NewStore(NewMemFS(), testDir, 2)
	commit(t, s)
	if ok, err := s.MarkFinal(7, []int64{7, 6}); ok || err != nil {
		t.Fatalf("MarkFinal with a shard past the checkpoint = %t, %v; want false, nil", ok, err)
	}
	if final(t, s) {
		t.Fatal("a checkpoint not holding the final state was marked final")
	}
	if ok, err := s.MarkFinal(8, []int64{7, 7}); ok || err == nil {
		t.Fatalf("MarkFinal of a missing checkpoint = %t, %v; want an error", ok, err)
	}
	if ok, err := s.MarkFinal(7, []int64{7, 7}); !ok || err != nil {
		t.Fatalf("MarkFinal = %t, %v; want true, nil", ok, err)
	}
	if !final(t, s) {
		t.Fatal("not marked final")
	}
	checkLoads(t, s, s.Path(7), 7)

	for k := 0; ; k++ {
		m := NewMemFS()
		commit(t, NewStore(m, testDir, 2))
		f := NewFaultFS(m, k, false)
		ok, err := NewStore(f, testDir, 2).MarkFinal(7, []int64{7, 7})
		if !f.Triggered() {
			if !ok || err != nil {
				t.Fatalf("no fault injected at %d, but MarkFinal = %t, %v", k, ok, err)
			}
			if k < 3 {
				t.Fatalf("only %d operations", k)
			}
			break
		}
		got := final(t, NewStore(m, testDir, 2))
		if ok && !got {
			t.Fatalf("fault at op %d (%s): MarkFinal said yes, the manifest says no", k, f.Ops()[k])
		}
	}
}

// TestHashAsWrittenEqualsHashAlongside: a shard hashed from the bytes as
// they are written (one processor) has the hash and the bytes of one
// hashed alongside on another goroutine, and commits (Commit re-reads
// every file against its hash) and loads.
func TestHashAsWrittenEqualsHashAlongside(t *testing.T) {
	var infos [2][]ShardInfo
	for i, parallel := range []bool{true, false} {
		s := NewStore(NewMemFS(), testDir, 0)
		s.parallelHash = parallel
		m := saveCheckpoint(t, s, 4, 2)
		infos[i] = m.Shards
		if err := s.Verify(s.Path(4)); err != nil {
			t.Fatalf("parallel %t: %v", parallel, err)
		}
		checkLoads(t, s, s.Path(4), 4)
	}
	for i := range infos[0] {
		a, b := infos[0][i], infos[1][i]
		if a.SHA256 != b.SHA256 || a.Bytes != b.Bytes || a.SHA256 == "" {
			t.Fatalf("shard %d: hashed alongside %+v, as written %+v", i, a, b)
		}
	}
}

// TestReadShardSomeKeepsWhatItIsAskedForAndHashesAll: the tensors keep
// refuses come without data, the others as written, and a damaged byte
// in a tensor not kept still fails the read.
func TestReadShardSomeKeepsWhatItIsAskedForAndHashesAll(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	saveCheckpoint(t, s, 10, 2)
	ck, err := s.Load(s.Path(10))
	mustNo(t, err)
	want := shardTensors(10, 1)
	kept := want[2].Name // the bias
	keep := func(name string) bool { return name == kept }
	got, _, err := ck.ReadShardSome(1, keep)
	mustNo(t, err)
	if len(got) != len(want) {
		t.Fatalf("%d tensors, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.Name || !slices.Equal(g.Shape, w.Shape) {
			t.Fatalf("tensor %d: %s %v, want %s %v", i, g.Name, g.Shape, w.Name, w.Shape)
		}
		switch {
		case w.Name == kept && !slices.Equal(g.Data, w.Data):
			t.Fatalf("kept tensor %s: %v, want %v", w.Name, g.Data, w.Data)
		case w.Name != kept && g.Data != nil:
			t.Fatalf("tensor %s not asked for came with %d values", w.Name, len(g.Data))
		}
	}
	// A byte of the first (largest) tensor, not kept, damaged.
	name := filepath.Join(s.Path(10), ck.Manifest.Shards[1].File)
	b, _ := fileContents(t, m, name)
	raw := []byte(b)
	raw[len(raw)/3] ^= 1
	writeFile(t, m, name, string(raw), true)
	if _, _, err := ck.ReadShardSome(1, keep); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a damaged byte in a tensor not kept: %v, want %v", err, ErrCorrupt)
	}
}

// CommitReading checks the files as Commit does, reading them as it
// goes: it returns what a read of the committed checkpoint keeping the
// same tensors returns, and commits nothing when a byte of a tensor it
// does not keep is damaged.
func TestCommitReadingReturnsWhatAReadGives(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	infos, err := writeShards(s, 5, 2)
	mustNo(t, err)
	bias := strings.TrimPrefix(shardTensors(5, 0)[2].Name, "s0/") // each shard's is s<i>/ and this
	keep := func(name string) bool { return strings.HasSuffix(name, "/"+bias) }
	name := filepath.Join(testDir, DirName(5)+".tmp", infos[1].File)
	orig, _ := fileContents(t, m, name)
	raw := []byte(orig)
	raw[len(raw)/3] ^= 1
	writeFile(t, m, name, string(raw), true)
	if _, err := s.CommitReading(testManifest(5, infos), -1, keep); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a damaged byte in a tensor not kept: %v, want %v", err, ErrCorrupt)
	}
	if infos, _ := s.List(); len(infos) != 0 {
		t.Fatalf("a damaged checkpoint was committed: %+v", infos)
	}
	writeFile(t, m, name, orig, true)
	got, err := s.CommitReading(testManifest(5, []ShardInfo{infos[1], infos[0]}), -1, keep)
	mustNo(t, err)
	ck, err := s.Load(s.Path(5))
	mustNo(t, err)
	if len(got) != 2 {
		t.Fatalf("%d shards read, want 2", len(got))
	}
	for i := range got {
		want, meta, err := ck.ReadShardSome(i, keep)
		mustNo(t, err)
		kept := 0
		for j, w := range want {
			g := got[i].Tensors[j]
			if g.Name != w.Name || !slices.Equal(g.Shape, w.Shape) || !slices.Equal(g.Data, w.Data) {
				t.Fatalf("shard %d tensor %d: %s %v (%d values), want %s %v (%d)", i, j, g.Name, g.Shape, len(g.Data), w.Name, w.Shape, len(w.Data))
			}
			if g.Data != nil {
				kept++
			}
		}
		if kept != 1 || got[i].Meta["step"] != meta["step"] || meta["step"] != "5" {
			t.Fatalf("shard %d: %d tensors with data, metadata %v, want 1 and %v", i, kept, got[i].Meta, meta)
		}
	}
}

// RemoveAfter deletes the checkpoints after a step, and only those: the
// one at the step stays the newest, and a temporary directory of a later
// step is left to the next commit's cleanup.
func TestRemoveAfter(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	for step := int64(1); step <= 4; step++ {
		saveCheckpoint(t, s, step, 2)
	}
	mustNo(t, m.MkdirAll(filepath.Join(testDir, DirName(5)+".tmp"), 0o755))
	n, err := s.RemoveAfter(2)
	mustNo(t, err)
	got := strings.Join(listSteps(t, m, testDir), " ")
	if want := "ckpt-000000000001 ckpt-000000000002 ckpt-000000000005.tmp"; n != 2 || got != want {
		t.Fatalf("RemoveAfter(2): %d removed, left %s; want 2, %s", n, got, want)
	}
	latest, _, err := s.Latest()
	mustNo(t, err)
	if latest.Step != 2 {
		t.Errorf("newest after RemoveAfter(2): step %d", latest.Step)
	}
}
