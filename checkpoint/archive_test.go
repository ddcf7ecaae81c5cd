package checkpoint

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestArchiveAndPrune(t *testing.T) {
	m := NewMemFS()
	s := NewStore(m, testDir, 0)
	t0 := testCreated()
	if dir, n, err := s.Archive(t0); err != nil || n != 0 || dir != "" {
		t.Fatalf("archiving an empty store: %q, %d, %v", dir, n, err)
	}
	// Four runs, each archived when the next starts.
	var made []string
	for run := range 4 {
		saveCheckpoint(t, s, int64(10*run+1), 2)
		saveCheckpoint(t, s, int64(10*run+2), 2)
		at := t0.Add(time.Duration(run) * 1500 * time.Millisecond)
		dir, n, err := s.Archive(at)
		mustNo(t, err)
		if n != 2 || dir != filepath.Join(testDir, ArchiveName(at)) {
			t.Fatalf("run %d: archived %d to %s", run, n, dir)
		}
		made = append(made, filepath.Base(dir))
		if got := strings.Join(listSteps(t, m, dir), " "); got != DirName(int64(10*run+1))+" "+DirName(int64(10*run+2)) {
			t.Fatalf("run %d: archive holds %s", run, got)
		}
	}
	if made[1] != "archive-20250301T120001.500" {
		t.Fatalf("archive name %s", made[1])
	}
	// Not archives: left alone whatever keep says.
	mustNo(t, m.MkdirAll(filepath.Join(testDir, "archive-mine"), 0o755))
	writeFile(t, m, filepath.Join(testDir, "archive-20250301T120000.000.txt"), "a file", false)

	if got, err := s.PruneArchives(-1); err != nil || len(got) != 0 {
		t.Fatalf("keep -1 deleted %v, %v", got, err)
	}
	got, err := s.PruneArchives(2)
	mustNo(t, err)
	if strings.Join(got, " ") != strings.Join(made[:2], " ") {
		t.Fatalf("keep 2 deleted %v, want the two oldest %v", got, made[:2])
	}
	left, err := s.Archives()
	mustNo(t, err)
	if strings.Join(left, " ") != strings.Join(made[2:], " ") {
		t.Fatalf("archives left %v, want %v", left, made[2:])
	}
	// The archived checkpoints are intact.
	a := NewStore(m, filepath.Join(testDir, made[3]), 0)
	checkLoads(t, a, a.Path(32), 32)

	got, err = s.PruneArchives(0)
	mustNo(t, err)
	if len(got) != 2 {
		t.Fatalf("keep 0 deleted %v", got)
	}
	if names := strings.Join(listSteps(t, m, testDir), " "); names != "archive-20250301T120000.000.txt archive-mine" {
		t.Fatalf("left %s", names)
	}
}
