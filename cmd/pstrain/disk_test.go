package main

// Multi-process tests of what disks and flags do to a run: a full disk
// (a 3 MiB tmpfs: every checkpoint fails, or old ones are deleted to make
// room), checkpoints that are all damaged, and the checks made before any
// process starts (memory, ports, timeouts, addresses, data files).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/testbin"
	"github.com/pstrain/pstrain/observe/report"
)

// smallDisk mounts a tmpfs of size (e.g. "3m") on a new directory and
// unmounts it when the test ends; it skips the test where mounting is
// not permitted (not root).
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a %s tmpfs to fill (%v: %s); a full disk needs root", size, err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// exitStatus is the exit status err (from pstrain) says, 0 for nil.
func exitStatus(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("pstrain did not run: %v", err)
	return -1
}

// diskRun runs a short cluster with its checkpoints in ckdir and returns
// its status, output and report.
func diskRun(t *testing.T, ctx context.Context, tmp, ckdir string, args ...string) (int, string, *report.Report) {
	t.Helper()
	rp := filepath.Join(tmp, "report.json")
	base := []string{"run", "--data-dir", testbin.MNIST(t), "--target-accuracy", "0", "--eval-every", "0",
		"--checkpoint-dir", ckdir, "--run-dir", filepath.Join(tmp, "run"), "--sd-dir", "", "--report", rp}
	out, err := pstrain(t, ctx, append(base, args...)...)
	status := exitStatus(t, err)
	rep, rerr := report.Read(rp)
	if rerr != nil {
		t.Fatalf("pstrain run (status %d) wrote no report: %v\n%s", status, rerr, out)
	}
	return status, out, rep
}

// TestFullDisk: on a 3 MiB disk no checkpoint of the default model (5 MB)
// fits. Every attempt fails with a warning on the terminal, the report
// counts them, nothing is left on the disk, and since the final
// checkpoint failed the run exits with status 3 and says the model is not
// saved. A smaller model (640 kB a checkpoint) with every checkpoint kept
// fills the same disk after four: the PS delete the older ones to make
// room and every checkpoint commits.
func TestFullDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	testbin.MNIST(t)
	t.Run("nothing fits", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		tmp, disk := t.TempDir(), smallDisk(t, "3m")
		// 70 steps: a routine checkpoint is tried (and fails) before the
		// final one even on a fast machine.
		status, out, rep := diskRun(t, ctx, tmp, disk, "--data-fraction", "0.3", "--epochs", "1", "--checkpoint-every", "5")
		if status != 3 {
			t.Errorf("exit status %d, want 3 (the final checkpoint failed)\n%s", status, out)
		}
		for _, want := range []string{
			`level=WARN msg="checkpoint failed; training goes on`,
			`level=ERROR msg="the final checkpoint failed: the trained model is not saved"`,
			"FAILED, the final one too: the trained model is NOT saved",
			"pstrain: the final checkpoint failed, so the trained model is not saved: ",
			"no space left on device",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the terminal does not say %q:\n%s", want, out)
			}
		}
		ck := rep.Checkpoints
		if ck.Committed != 0 || ck.Failed < 2 || !ck.FinalFailed || !strings.Contains(ck.LastError, "no space left on device") {
			t.Errorf("report checkpoints %+v: want none committed, at least a routine and the final one failed on ENOSPC", ck)
		}
		if c := rep.Tasks["chief"]; c.ExitCode != 3 || c.Restarts != 0 {
			t.Errorf("chief %+v: want exit status 3 and no restart", c)
		}
		if left, _ := os.ReadDir(disk); len(left) != 0 {
			t.Errorf("the full disk holds %v after the run; want nothing (no .tmp)", left)
		}
	})
	t.Run("old checkpoints make room", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		tmp, disk := t.TempDir(), smallDisk(t, "3m")
		// Every 20 steps of 938: up to 46 routine checkpoints, one in
		// flight at a time and one per chief poll (~0.1 s), so fewer; 3
		// epochs (351 steps) train in about 0.5 s and commit only 5.
		status, out, rep := diskRun(t, ctx, tmp, disk, "--data-fraction", "0.5", "--epochs", "8", "--hidden", "100",
			"--keep-checkpoints", "0", "--checkpoint-every", "20")
		if status != 0 {
			t.Fatalf("exit status %d\n%s", status, out)
		}
		if ck := rep.Checkpoints; ck.Failed != 0 || ck.Committed < 6 {
			t.Errorf("report checkpoints %+v: want none failed and at least 6 committed (4 fit at once)\n%s", ck, grepLines(filepath.Join(tmp, "run", "logs", "chief.log"), "checkpoint"))
		}
		logs, _ := filepath.Glob(filepath.Join(tmp, "run", "logs", "ps-*.log"))
		freed := false
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			freed = freed || bytes.Contains(b, []byte("checkpoint disk full: deleted older checkpoints"))
		}
		if !freed {
			t.Errorf("no PS log says it freed space: the disk never filled and the test proves nothing")
		}
		latest, _, err := checkpoint.NewStore(checkpoint.OSFS{}, disk, 0).Latest()
		// The final checkpoint is the newest and holds the last step's
		// model (its directory is named by the newest shard version:
		// docs/recovery.md, "The final checkpoint").
		if err != nil || latest.Manifest == nil || !latest.Manifest.Final || latest.Manifest.Version != rep.GlobalSteps {
			chiefLog, _ := os.ReadFile(filepath.Join(tmp, "run", "logs", "chief.log"))
			t.Errorf("newest valid checkpoint %+v (%v, final %v): want the final one, of step %d (final_step %d, restarts %+v)\nchief.log:\n%s",
				latest, err, latest.Manifest != nil && latest.Manifest.Final, rep.GlobalSteps, rep.FinalStep, rep.Restarts, chiefLog)
		}
	})
}

// writeDamaged writes checkpoints of steps into dir and damages every
// one (a flipped byte in a shard).
func writeDamaged(t *testing.T, dir string, steps ...int64) []string {
	t.Helper()
	store := checkpoint.NewStore(checkpoint.OSFS{}, dir, 0)
	var names []string
	for _, step := range steps {
		ts := []checkpoint.Tensor{{Name: "layer0/w[0:2]", Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}}
		info, err := store.WriteShard(step, 0, 1, ts, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Commit(checkpoint.Manifest{Step: step, Shards: []checkpoint.ShardInfo{info}}); err != nil {
			t.Fatal(err)
		}
		shard := filepath.Join(store.Path(step), info.File)
		b, err := os.ReadFile(shard)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)-1] ^= 0x40
		if err := os.WriteFile(shard, b, 0o644); err != nil {
			t.Fatal(err)
		}
		names = append(names, checkpoint.DirName(step))
	}
	return names
}

// TestResumeRefusesDamagedCheckpoints: `pstrain run` (resuming by
// default) finds checkpoints, every one damaged: it refuses before
// starting anything, naming each and why. --resume=false starts afresh,
// moving them to an archive, and --keep-archives 1 deletes the older
// archive already there.
func TestResumeRefusesDamagedCheckpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	ckdir := filepath.Join(tmp, "ck")
	names := writeDamaged(t, ckdir, 100, 200)
	oldArchive := filepath.Join(ckdir, checkpoint.ArchiveName(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)))
	if err := os.MkdirAll(filepath.Join(oldArchive, checkpoint.DirName(5)), 0o755); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	out, err := pstrain(t, ctx, "run", "--data-dir", testbin.MNIST(t), "--checkpoint-dir", ckdir,
		"--run-dir", filepath.Join(tmp, "run"), "--sd-dir", "")
	if s := exitStatus(t, err); s != 1 {
		t.Errorf("exit status %d, want 1", s)
	}
	for _, want := range append(names, "cannot resume from "+ckdir, "every checkpoint is damaged", "SHA-256", "pass --resume=false to start afresh") {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, "run", "logs")); err == nil {
		t.Errorf("the refused run started tasks (%s exists)", filepath.Join(tmp, "run", "logs"))
	}
	t.Logf("refused in %v", time.Since(start).Round(time.Millisecond))

	status, out, rep := diskRun(t, ctx, tmp, ckdir, "--resume=false", "--keep-archives", "1", "--data-fraction", "0.1", "--epochs", "1")
	if status != 0 || rep.Checkpoints.Committed == 0 {
		t.Fatalf("--resume=false: status %d, checkpoints %+v\n%s", status, rep.Checkpoints, out)
	}
	archives, _ := filepath.Glob(filepath.Join(ckdir, "archive-*"))
	if len(archives) != 1 || archives[0] == oldArchive {
		t.Fatalf("archives %v: want only the one this run made (--keep-archives 1)", archives)
	}
	moved, _ := os.ReadDir(archives[0])
	if len(moved) != 2 || moved[0].Name() != names[0] || moved[1].Name() != names[1] {
		t.Errorf("the new archive holds %v, want the damaged %v", moved, names)
	}
}

// idxFile is an IDX file of uint8 with dims, its body cut to keep bytes
// (-1: all).
func idxFile(t *testing.T, path string, keep int, dims ...uint32) {
	t.Helper()
	var b bytes.Buffer
	b.Write([]byte{0, 0, 8, byte(len(dims))})
	n := 1
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, d)
		n *= int(d)
	}
	body := make([]byte, n)
	if keep >= 0 {
		body = body[:keep]
	}
	b.Write(body)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestChecksBeforeStarting: flags the machine cannot run and data the
// tasks cannot load are refused at once with a clear error, before any
// process starts; command-line values with status 2, bad data with 1.
func TestChecksBeforeStarting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, tmp := testbin.MNIST(t), t.TempDir()
	bin.Path(t) // built before the clock starts
	// A small IDX set whose training images are cut short.
	idxFile(t, filepath.Join(tmp, "ti"), 100*784-9, 100, 28, 28)
	idxFile(t, filepath.Join(tmp, "tl"), -1, 100)
	idxFile(t, filepath.Join(tmp, "si"), -1, 10, 28, 28)
	idxFile(t, filepath.Join(tmp, "sl"), -1, 10)
	a := freeAddrs(t, 3)
	_, port, _ := strings.Cut(a[0], ":")
	same, good := filepath.Join(tmp, "same.json"), filepath.Join(tmp, "good.json")
	os.WriteFile(same, []byte(fmt.Sprintf(`{"chief":["localhost:%s"],"ps":["%s"],"worker":["127.0.0.1:%s"]}`, port, a[1], port)), 0o644)
	os.WriteFile(good, []byte(fmt.Sprintf(`{"chief":["%s"],"ps":["%s"],"worker":["%s"]}`, a[0], a[1], a[2])), 0o644)
	worker := func(cluster string, more ...string) []string {
		return append([]string{"worker", "--cluster", cluster, "--index", "0", "--ps", "1", "--workers", "1", "--data-dir", d, "--metrics-addr", "off"}, more...)
	}

	for _, c := range []struct {
		name   string
		args   []string
		status int
		want   []string
	}{
		{"model too big", []string{"run", "--data-dir", d, "--hidden", "2000000000"}, 2,
			[]string{"the run (a chief, 2 PS and 2 workers, model 784-2000000000-10, batch 128) needs at least", "TiB", "available (MemAvailable"}},
		{"batch too big", []string{"run", "--data-dir", d, "--batch", "2000000000"}, 2, []string{"batch 2000000000) needs at least", "available"}},
		{"a worker's batch too big", worker(good, "--batch", "2000000000"), 2,
			[]string{"worker/0 (model 784-800-10, batch 2000000000) needs at least"}},
		{"one address under two names", worker(same), 2,
			[]string{"cluster: chief (localhost:" + port + ") and worker/0 (127.0.0.1:" + port + ") are the same address"}},
		{"ports past 65535", []string{"run", "--data-dir", d, "--metrics-port-base", "70000"}, 2, []string{"--metrics-port-base 70000 is not a port"}},
		{"ports run past 65535", []string{"run", "--data-dir", d, "--metrics-port-base", "65533"}, 2, []string{"up to 65537, past the last port 65535"}},
		{"no connect timeout", []string{"run", "--data-dir", d, "--connect-timeout", "0"}, 2, []string{"--connect-timeout must be > 0"}},
		{"a task's connect timeout", worker(good, "--connect-timeout", "-1s"), 2, []string{"--connect-timeout must be > 0"}},
		{"truncated IDX", []string{"run", "--dataset", "idx:ti,tl,si,sl", "--data-dir", tmp}, 1,
			[]string{filepath.Join(tmp, "ti") + ": idx: truncated: dims [100 28 28] declare 78400 data bytes, input has 78391"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			args := c.args
			if args[0] == "run" {
				args = append(args, "--run-dir", filepath.Join(dir, "run"), "--sd-dir", "", "--checkpoint-dir", filepath.Join(dir, "ck"))
			}
			start := time.Now()
			out, err := pstrain(t, ctx, args...)
			took := time.Since(start)
			if s := exitStatus(t, err); s != c.status {
				t.Errorf("exit status %d, want %d\n%s", s, c.status, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("the error does not say %q:\n%s", w, out)
				}
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("something started: %s holds %v", dir, entries)
			}
			// MNIST's MD5s are checked first (about 0.3 s here).
			if took > 20*time.Second {
				t.Errorf("took %v to refuse", took)
			}
		})
	}
}

// grepLines returns the lines of the file at path that contain sub.
func grepLines(path, sub string) string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
