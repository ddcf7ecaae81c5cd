package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/blas"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
)

const checkpointUsage = `  pstrain checkpoint ls DIR        list the checkpoints in DIR, newest first, with a quick check
  pstrain checkpoint verify DIR    fully verify every checkpoint (SHA-256 of every shard); fails if the newest is bad
  pstrain checkpoint inspect PATH  show a checkpoint's manifest and tensors (PATH: a ckpt-* directory, or DIR for the newest valid one)`

func cmdCheckpoint(_ context.Context, args []string, stdout, _ io.Writer) error {
	for i, a := range args {
		if isHelp(a) && (i == 0 || a != "help") { // a directory may be called help
			fmt.Fprintf(stdout, "usage:\n%s\n", checkpointUsage)
			return flag.ErrHelp
		}
	}
	switch {
	case len(args) == 0:
		return usagef("missing subcommand: ls, verify or inspect")
	case args[0] != "ls" && args[0] != "verify" && args[0] != "inspect":
		return usagef("unknown subcommand %q: want ls, verify or inspect", args[0])
	case len(args) != 2:
		return usagef("%s takes one directory, got %d arguments", args[0], len(args)-1)
	case strings.HasPrefix(args[1], "-"):
		return usagef("unknown flag %q: %s takes only a directory (./%s for one named so)", args[1], args[0], args[1])
	}
	dir := args[1]
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	switch args[0] {
	case "ls":
		return checkpointLs(dir, stdout)
	case "verify":
		return checkpointVerify(dir, stdout)
	}
	return checkpointInspect(dir, stdout)
}

func checkpointLs(dir string, stdout io.Writer) error {
	infos, err := checkpoint.NewStore(checkpoint.OSFS{}, dir, 0).List()
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		fmt.Fprintf(stdout, "no checkpoints in %s\n", dir)
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tVERSION\tMODE\tSHARDS\tBYTES\tCREATED\tFINAL\tSTATUS\tPATH")
	for _, in := range infos {
		if in.Manifest == nil {
			fmt.Fprintf(tw, "%d\t-\t-\t-\t-\t-\t-\tBAD: %v\t%s\n", in.Step, in.Err, in.Path)
			continue
		}
		m := in.Manifest
		var bytes int64
		for _, sh := range m.Shards {
			bytes += sh.Bytes
		}
		st := "ok (sizes; `verify` checks contents)"
		if in.Err != nil {
			st = "BAD: " + in.Err.Error()
		}
		final := "no"
		if m.Final {
			final = "yes"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", m.Step, m.Version, m.Mode, m.NumShards, bytes,
			m.Created.Format("2006-01-02 15:04:05"), final, st, in.Path)
	}
	return tw.Flush()
}

func checkpointVerify(dir string, stdout io.Writer) error {
	store := checkpoint.NewStore(checkpoint.OSFS{}, dir, 0)
	infos, err := store.List()
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		return fmt.Errorf("no checkpoints in %s", dir)
	}
	bad := 0
	for _, in := range infos {
		err := in.Err
		if err == nil {
			err = store.Verify(in.Path)
		}
		if err != nil {
			bad++
			fmt.Fprintf(stdout, "BAD  step %d  %s: %v\n", in.Step, in.Path, err)
		} else {
			fmt.Fprintf(stdout, "ok   step %d  %s\n", in.Step, in.Path)
		}
	}
	latest, _, err := store.Latest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d of %d checkpoints valid; a resume would use step %d (%s)\n", len(infos)-bad, len(infos), latest.Step, latest.Path)
	if bad > 0 && infos[0].Path != latest.Path {
		return fmt.Errorf("the newest checkpoint (step %d) is damaged", infos[0].Step)
	}
	return nil
}

// openCheckpoint opens path: a ckpt-* directory, or a checkpoint
// directory whose newest valid checkpoint is taken.
func openCheckpoint(path string) (*checkpoint.Checkpoint, error) {
	path = filepath.Clean(path)
	if _, err := os.Stat(filepath.Join(path, checkpoint.ManifestName)); err == nil {
		return checkpoint.NewStore(checkpoint.OSFS{}, filepath.Dir(path), 0).Load(path)
	}
	store := checkpoint.NewStore(checkpoint.OSFS{}, path, 0)
	info, skipped, err := store.Latest()
	for _, sk := range skipped {
		fmt.Fprintf(os.Stderr, "skipping damaged checkpoint %s: %v\n", sk.Path, sk.Err)
	}
	if err != nil {
		return nil, err
	}
	return store.Load(info.Path)
}

func checkpointInspect(path string, stdout io.Writer) error {
	ck, err := openCheckpoint(path)
	if err != nil {
		return err
	}
	m := ck.Manifest
	fmt.Fprintf(stdout, "checkpoint %s\n", ck.Path)
	fmt.Fprintf(stdout, "step %d, version %d, mode %s, %d shards, created %s\n", m.Step, m.Version, m.Mode, m.NumShards, m.Created.Format("2006-01-02 15:04:05 MST"))
	fmt.Fprintf(stdout, "model %s\noptimizer %s\nfinal %t\nrun %s\n", compactJSON(m.ModelSpec), optimizerLine(m), m.Final, runLine(m.RunConfig))
	totals := map[string]*tableTotal{}
	for i, sh := range m.Shards {
		tensors, meta, err := ck.ReadShard(i)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\n%s  %d bytes  version %d  sha256 %s…  %s\n", sh.File, sh.Bytes, sh.Version, sh.SHA256[:16], keyValues(meta))
		for _, t := range tensors {
			if t.DType == checkpoint.U64 {
				fmt.Fprintf(stdout, "  %-28s %v U64\n", t.Name, t.Shape)
				continue
			}
			fmt.Fprintf(stdout, "  %-28s %v\n", t.Name, t.Shape)
		}
		if err := tableLines(stdout, tensors, sh.File, totals); err != nil {
			return err
		}
	}
	tableTotals(stdout, totals)
	return nil
}

// tableTotal is one embedding table over a checkpoint's shards.
type tableTotal struct {
	kind  string
	dim   int
	rows  int
	bytes int64
}

// tableLines shows a shard file's embedding tables, their rows and
// bytes, and adds them to totals.
func tableLines(w io.Writer, tensors []checkpoint.Tensor, file string, totals map[string]*tableTotal) error {
	tables, err := shardckpt.TablesOf(tensors, file)
	if err != nil {
		return err
	}
	for _, r := range tables {
		fmt.Fprintf(w, "  table %s: %d rows of %d, %s, %d bytes\n", r.Name, len(r.Keys), r.Dim, r.Kind, r.Bytes())
		t := totals[r.Name]
		if t == nil {
			t = &tableTotal{kind: string(r.Kind), dim: r.Dim}
			totals[r.Name] = t
		}
		t.rows += len(r.Keys)
		t.bytes += r.Bytes()
	}
	return nil
}

// tableTotals shows each table's rows and bytes over the shards.
func tableTotals(w io.Writer, totals map[string]*tableTotal) {
	if len(totals) == 0 {
		return
	}
	fmt.Fprintf(w, "\nembedding tables (all shards)\n")
	for _, name := range slices.Sorted(maps.Keys(totals)) {
		t := totals[name]
		fmt.Fprintf(w, "  %-20s %d rows of %d (%s)  %d parameters  %d bytes\n", name, t.rows, t.dim, t.kind, t.rows*t.dim, t.bytes)
	}
}

// optimizerLine describes what a checkpoint was trained with, e.g.
// "momentum lr 0.05 momentum 0.9 schedule cosine warmup 0": the name, the
// learning rate, the other hyperparameters by name, and the learning-rate
// schedule (from the run configuration for a manifest that does not
// record it; constant before schedules existed).
func optimizerLine(m checkpoint.Manifest) string {
	o := m.Optimizer
	var b strings.Builder
	b.WriteString(o.Name)
	keys := slices.Sorted(maps.Keys(o.Hyperparams))
	if i := slices.Index(keys, "lr"); i > 0 {
		keys = append([]string{"lr"}, slices.Delete(keys, i, i+1)...)
	}
	for _, k := range keys {
		fmt.Fprintf(&b, " %s %s", k, strconv.FormatFloat(o.Hyperparams[k], 'g', -1, 64))
	}
	sched, warmup := o.Schedule, o.WarmupSteps
	if sched == "" {
		sched = "constant"
		if r, err := config.Parse(m.RunConfig); err == nil && len(m.RunConfig) > 0 {
			sched, warmup = r.LRSchedule, r.WarmupSteps
		}
	}
	fmt.Fprintf(&b, " schedule %s warmup %d", sched, warmup)
	return b.String()
}

// cmdEval scores a checkpoint on the test set.
func cmdEval(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("eval", "eval --checkpoint DIR [flags]", "Score a checkpoint's model on the test set of its run's data set.")
	path := fs.String("checkpoint", "", "a ckpt-* directory, or a checkpoint directory (its newest valid checkpoint)")
	dataDir := fs.String("data-dir", "", "directory holding the data sets (default: the run's)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *path == "" {
		return usagef("missing --checkpoint DIR")
	}
	ck, err := openCheckpoint(*path)
	if err != nil {
		return err
	}
	r, err := config.Parse(ck.Manifest.RunConfig)
	if err != nil {
		return fmt.Errorf("%s: %w", ck.Path, err)
	}
	var spec model.Spec
	if err := json.Unmarshal(ck.Manifest.ModelSpec, &spec); err != nil {
		return fmt.Errorf("%s: model spec: %w", ck.Path, err)
	}
	if *dataDir != "" {
		r.DataDir = *dataDir
	}
	if err := blas.Setup(1); err != nil {
		return err
	}
	if spec.IsCTR() {
		return evalCTR(ctx, ck, r, spec, stdout)
	}
	return evalClassifier(ck, r, spec, stdout)
}

// evalClassifier scores an MLP's or a CNN's checkpoint on its data set's
// test set.
func evalClassifier(ck *checkpoint.Checkpoint, r config.Run, spec model.Spec, stdout io.Writer) error {
	test, _, err := dataset.LoadEval(r.DataDir, r.Dataset) // the test set alone
	if err != nil {
		return err
	}
	if test.Dim != spec.Input || test.Classes != spec.Classes {
		return fmt.Errorf("the checkpoint's model %s does not fit %s (%d inputs, %d classes)", spec, r.Dataset, test.Dim, test.Classes)
	}
	st, err := shardckpt.Read(ck, spec, r.Optimizer)
	if err != nil {
		return err
	}
	ev, err := chief.NewEvaluator(spec, test, 1000, 0)
	if err != nil {
		return err
	}
	defer ev.Close()
	for v, dst := range ev.Params() {
		copy(dst, st.Vars[v])
	}
	acc, loss, err := ev.Eval()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "checkpoint %s (step %d, version %d, model %s)\n", ck.Path, ck.Manifest.Step, ck.Manifest.Version, spec)
	fmt.Fprintf(stdout, "test accuracy %.2f%%  test loss %.4f  on %d %s test images\n", 100*acc, loss, test.N, r.Dataset)
	return nil
}

// runLine renders a manifest's run configuration as the flags that run
// it ("--mode=sync ... --eval-every=1s --checkpoint-every=10s"):
// durations as durations, not the nanoseconds of its JSON. A configuration
// that does not parse is shown as its JSON.
func runLine(b []byte) string {
	r, err := config.Parse(b)
	if err != nil || len(b) == 0 {
		return compactJSON(b)
	}
	return strings.Join(runArgs(r), " ")
}

// keyValues renders a map as "k1=v1 k2=v2", by key.
func keyValues(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, " ")
}

func compactJSON(b []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	return buf.String()
}
