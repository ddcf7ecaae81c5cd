package chief_test

// In-process runs on a small disk (a checkpoint.MemFS with a capacity)
// and on damaged checkpoints: failures are counted, logged as warnings
// and leave nothing behind; a disk that can spare old checkpoints heals;
// a resume that finds only damaged checkpoints refuses to start.

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/internal/syncbuf"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/testcluster"
)

// diskRun starts a paced run of run on fsys, logging to log, with the
// chief's metrics in m.
func diskRun(t *testing.T, run config.Run, fsys checkpoint.FS, log *syncbuf.Buffer, m *metrics.Chief) (*testcluster.Cluster, *dataset.Dataset) {
	t.Helper()
	train, test := testcluster.SyntheticSplit(nTrain, nTest, dim, classes, 1)
	c := testcluster.New(t, testcluster.Config{Run: run, Spec: run.Spec(dim, classes), Train: train, CheckpointFS: fsys,
		Log:   slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Chief: &testcluster.ChiefConfig{Test: test, PollEvery: 10 * time.Millisecond, Metrics: m}})
	if err := c.StartWorkers(paced); err != nil {
		t.Fatal(err)
	}
	return c, train
}

// entries lists the checkpoint directory's names.
func entries(t *testing.T, fsys checkpoint.FS, dir string) []string {
	t.Helper()
	es, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestClusterFullDisk: no checkpoint fits. Each failure is counted (in
// the report and pstrain_checkpoint_failures_total) and logged as a
// warning, the final one is flagged, training goes on to the end, and
// no temporary directory is left.
func TestClusterFullDisk(t *testing.T) {
	run := tinyRun(config.Sync, 20)
	run.CheckpointEvery = config.Every{Steps: 10}
	fsys := checkpoint.NewMemFS()
	fsys.SetCapacity(512) // less than one shard
	var log syncbuf.Buffer
	m := metrics.NewChief(prometheus.NewRegistry())
	c, train := diskRun(t, run, fsys, &log, m)
	rep := finish(t, c, run, train)

	ck := rep.Checkpoints
	if ck.Committed != 0 || ck.Failed < 2 || !ck.FinalFailed || !strings.Contains(ck.LastError, "no space left on device") {
		t.Fatalf("checkpoints %+v: want none committed, a routine one and the final one failed with ENOSPC", ck)
	}
	if got := testutil.ToFloat64(m.CheckpointFailures); got != float64(ck.Failed) {
		t.Errorf("pstrain_checkpoint_failures_total = %v, report says %d failed", got, ck.Failed)
	}
	out := log.String()
	if n := strings.Count(out, `level=WARN msg="checkpoint failed`); n != ck.Failed-1 {
		t.Errorf("%d warnings of a failed checkpoint, want %d (every routine one)", n, ck.Failed-1)
	}
	if !strings.Contains(out, `level=ERROR msg="the final checkpoint failed: the trained model is not saved"`) {
		t.Errorf("the final failure is not logged as an error:\n%s", out)
	}
	if es := entries(t, fsys, run.CheckpointDir); len(es) != 0 {
		t.Errorf("the checkpoint directory holds %v after every attempt failed; want nothing", es)
	}
}

// TestClusterSmallDiskHeals: a disk with room for two and a half
// checkpoints and --keep-checkpoints 3: each write that fills it deletes
// the older checkpoints (never the newest) and is retried, so every
// checkpoint commits.
func TestClusterSmallDiskHeals(t *testing.T) {
	run := tinyRun(config.Sync, 20)
	run.CheckpointEvery = config.Every{Steps: 10}
	fsys := checkpoint.NewMemFS()
	var log syncbuf.Buffer
	c, train := diskRun(t, run, fsys, &log, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The size of a checkpoint is known once one is on disk.
	var size int64
	if err := testcluster.WaitFor(ctx, "a committed checkpoint", func() bool {
		infos, err := c.Checkpoints().List()
		if err != nil || len(infos) == 0 || infos[0].Err != nil {
			return false
		}
		fi, err := fsys.Stat(filepath.Join(infos[0].Path, checkpoint.ManifestName))
		if err != nil {
			return false
		}
		size = fi.Size()
		for _, sh := range infos[0].Manifest.Shards {
			size += sh.Bytes
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	fsys.SetCapacity(size * 5 / 2)
	rep := finish(t, c, run, train)

	if ck := rep.Checkpoints; ck.Failed != 0 || ck.Committed < 6 {
		t.Fatalf("checkpoints %+v: want at least 6 committed (more than fit at once), none failed", ck)
	}
	if !strings.Contains(log.String(), "checkpoint disk full: deleted older checkpoints") {
		t.Error("the disk never filled: the test proves nothing")
	}
	infos, err := c.Checkpoints().List()
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) > 2 || infos[0].Step != rep.GlobalSteps || !infos[0].Manifest.Final {
		t.Errorf("%d checkpoints left, the newest of step %d (final: %t); want at most 2, the newest the final one (%d)", len(infos), infos[0].Step, infos[0].Manifest.Final, rep.GlobalSteps)
	}
	if err := c.Checkpoints().Verify(infos[0].Path); err != nil {
		t.Error(err)
	}
}

// TestClusterResumeRefusesDamaged: when every checkpoint is damaged, a
// resuming chief refuses to start, naming each; --resume=false starts
// afresh, archives them, and keeps --keep-archives archives.
func TestClusterResumeRefusesDamaged(t *testing.T) {
	run := tinyRun(config.Sync, 3)
	run.CheckpointEvery = config.Every{Steps: 10}
	fsys := checkpoint.NewMemFS()
	var log syncbuf.Buffer
	first, train := diskRun(t, run, fsys, &log, nil)
	finish(t, first, run, train)
	first.Close()
	store := checkpoint.NewStore(fsys, run.CheckpointDir, 0)
	infos, err := store.List()
	if err != nil || len(infos) < 2 {
		t.Fatalf("the first run left %d checkpoints (%v); want at least 2", len(infos), err)
	}
	var names []string
	for _, in := range infos {
		flipByte(t, fsys, filepath.Join(in.Path, checkpoint.ShardFileName(1, 2)))
		names = append(names, filepath.Base(in.Path))
	}

	run.Epochs = 4 // not a finished run's configuration
	second, _ := diskRun(t, run, fsys, &log, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = second.Chief().Wait(ctx)
	if err == nil || !errors.Is(err, checkpoint.ErrAllDamaged) {
		t.Fatalf("resuming from damaged checkpoints: %v", err)
	}
	for _, want := range append(names, "cannot resume", "--resume=false", "SHA-256") {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	second.Close()

	// Three archives of earlier runs; --keep-archives 2 keeps the newest
	// of them and the one this run makes.
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 3 {
		if err := fsys.MkdirAll(filepath.Join(run.CheckpointDir, checkpoint.ArchiveName(old.Add(time.Duration(i)*time.Hour))), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run.Resume, run.KeepArchives = false, 2
	third, train := diskRun(t, run, fsys, &log, nil)
	finish(t, third, run, train)
	archives, err := store.Archives()
	if err != nil || len(archives) != 2 || archives[0] != checkpoint.ArchiveName(old.Add(2*time.Hour)) {
		t.Fatalf("archives %v (%v): want the newest old one and this run's", archives, err)
	}
	moved := entries(t, fsys, filepath.Join(run.CheckpointDir, archives[1]))
	if strings.Join(moved, " ") != strings.Join(reversed(names), " ") {
		t.Errorf("this run's archive holds %v, want the damaged checkpoints %v", moved, names)
	}
}

// flipByte damages the middle byte of the file name on fsys.
func flipByte(t *testing.T, fsys checkpoint.FS, name string) {
	t.Helper()
	f, err := fsys.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	b[len(b)/2] ^= 0x40
	w, err := fsys.Create(name, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[len(s)-1-i] = x
	}
	return out
}
