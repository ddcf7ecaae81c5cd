package main

// The multi-process test of elastic workers in async and ssp runs
// (docs/elastic.md): `pstrain scale` 2 -> 4 -> 1 during one run of the
// real binary, every sample read once per epoch.

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/ml/dataset"
)

func TestScaleWorkersAsync(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, mode := range []string{"async", "ssp"} {
		for _, split := range []string{"queue", "fixed"} {
			t.Run(mode+"/"+split, func(t *testing.T) { scaleAsync(t, mode, split) })
		}
	}
}

// scaleAsync runs mode with 2 workers, scales to 4 and then to 1, and
// checks the changes, the removed workers' clean exits and the data
// read, epoch by epoch, from the final checkpoint's positions.
func scaleAsync(t *testing.T, mode, split string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ckdir := filepath.Join(dir, "ck")
	run := startRun(t, ctx, dir, "--mode", mode, "--data-split", split, "--staleness", "4", "--hidden", "32", "--batch", "32", "--data-fraction", "0.1",
		"--epochs", "100", "--heartbeat-timeout", "1s", "--lr", "0.05", "--lr-schedule", "constant", "--checkpoint-dir", ckdir, "--max-workers", "4")
	run.waitTraining(60 * time.Second)
	if out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--workers", "4"); err != nil {
		t.Fatalf("pstrain scale --workers 4: %v\n%s", err, out)
	}
	run.waitChanges(1, 60*time.Second)
	run.waitLive(4, 60*time.Second) // (with a queue the change is at once: the new workers may not have started)
	if out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--workers", "1"); err != nil {
		t.Fatalf("pstrain scale --workers 1: %v\n%s", err, out)
	}
	run.waitChanges(2, 60*time.Second)
	rep := run.finish(2 * time.Minute)
	st := run.waitChanges(2, 0) // the final state: a queue's leases grow all run

	got := rep.MembershipChanges
	if len(got) != 2 || got[0].From != 2 || got[0].To != 4 || got[1].From != 4 || got[1].To != 1 || rep.FinalWorkers != 1 {
		t.Fatalf("membership changes %+v, final workers %d; want 2 -> 4 -> 1", got, rep.FinalWorkers)
	}
	plan := st.Plan
	if len(plan.Eras) != 3 {
		t.Fatalf("data plan %+v, want 3 eras", plan)
	}
	for i, c := range got {
		if e := plan.Eras[i+1]; c.Epoch != e.Epoch || c.To != e.Workers || c.Seconds < c.AskedSeconds {
			t.Errorf("change %+v, plan's era %+v", c, e)
		}
	}
	if rep.StoppedBy != "epochs" || rep.FinalStep != rep.GlobalSteps {
		t.Errorf("stopped by %s at step %d of %d; want epochs at the last step", rep.StoppedBy, rep.FinalStep, rep.GlobalSteps)
	}
	if rep.DataLedger == nil || len(rep.DataLedger) > 0 {
		t.Errorf("data ledger %+v, want [] (no sample read twice or skipped)", rep.DataLedger)
	}
	for _, w := range []string{"worker/1", "worker/2", "worker/3"} {
		if !strings.Contains(run.out.String(), `msg="removed worker exited" task=`+w) {
			t.Errorf("%s did not exit cleanly:\n%s", w, run.out)
		}
	}
	latest, _, err := checkpoint.NewStore(checkpoint.OSFS{}, ckdir, 0).Latest()
	if err != nil {
		t.Fatal(err)
	}
	m := latest.Manifest
	if m == nil || !m.Final || len(m.DataPositions) < 4 {
		t.Fatalf("the newest checkpoint is %+v, want the final one with 4 positions", m)
	}
	// The removed workers read every batch of their eras, and no more.
	for w := 1; w < 4; w++ {
		if end, _ := plan.Ends(w); m.DataPositions[w] != end {
			t.Errorf("removed worker/%d's data position %d, want %d (the end of its eras %+v)", w, m.DataPositions[w], end, plan.Eras)
		}
	}
	ledger := epochLedger(plan, m.DataPositions[:4])
	complete := 0
	for e, l := range ledger {
		if l.read != l.want {
			break
		}
		complete = e + 1
	}
	// Every epoch before the last (which ends with the run, at a count
	// of gradients, not at a boundary) holds every sample once; the
	// eras' first epochs are among them. With a queue, the chunks the
	// workers hold unread when the run ends may also be of the epoch
	// before the last.
	incomplete := 1
	if plan.Queued() {
		incomplete = 2
	}
	if last := plan.Eras[2].Epoch; complete < int(last)+1 || complete < len(ledger)-incomplete {
		t.Errorf("epochs read in full: %d of %d (ledger %+v; plan %+v; positions %v)", complete, len(ledger), ledger, plan.Eras, m.DataPositions)
	}
	t.Logf("%s: changes %+v; %d complete epochs of %d; %d steps, %.2f%%, training %.1f s, %.0f samples/s", mode, got, complete, len(ledger),
		rep.GlobalSteps, 100*rep.TestAccuracy, rep.TrainSeconds, rep.SamplesPerSecond)
}

// epochRead is one global epoch's batches read (by the positions) and
// the batches its era's members have: every sample of their shards once.
type epochRead struct{ read, want int64 }

// epochLedger is, per global epoch, the batches the workers' data
// positions hold there (DataPlan.Locate of each position below them).
func epochLedger(plan dataset.DataPlan, positions []int64) []epochRead {
	var out []epochRead
	at := func(e int64) *epochRead {
		for int64(len(out)) <= e {
			k := 0
			for k+1 < len(plan.Eras) && plan.Eras[k+1].Epoch <= int64(len(out)) {
				k++
			}
			want := int64(plan.Eras[k].Workers) * plan.PerEpoch(k)
			if plan.Queued() {
				want = plan.ChunksPerEpoch() * int64(plan.Chunk)
			}
			out = append(out, epochRead{want: want})
		}
		return &out[e]
	}
	for w, pos := range positions {
		for p := range pos {
			if _, e, _, ok := plan.Locate(w, p); ok {
				at(e).read++
			}
		}
	}
	return out
}
