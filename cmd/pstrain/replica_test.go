package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
)

// With hot standbys (--ps-replicas 1) killing primaries loses nothing: the
// fault plan kills ps/0 (its standby takes over), then ps/1, then ps/0
// again — by then the standby of shard 0's new primary, so the primary
// goes on alone and re-attaches it when it is back. Fixed times would miss
// a run whose speed changes (a faulted run trained 1.5x as fast as its
// undisturbed baseline on a shared machine), so the kills go at the
// global steps of 15%, 35% and 55% of the undisturbed run's
// (--fault ps/0@step:N): each lands inside training however fast the
// machine trains. Every restart reports 0 steps lost, a failover says which replica took over
// and how fast, no checkpoint is restored, and the run ends within 0.3
// points of an undisturbed run with the same seed.
func TestHotStandbysLoseNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process fault test")
	}
	testbin.MNIST(t)
	modes := []struct {
		name string
		args []string
	}{
		{"sync", []string{"--mode", "sync", "--epochs", "4"}},
		{"async", []string{"--mode", "async", "--optimizer", "sgd", "--lr", "0.1", "--epochs", "5"}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			args := append([]string{"--ps-replicas", "1", "--checkpoint-every", "0"}, m.args...)
			base, _ := faultRun(t, ctx, t.TempDir(), args...)
			if len(base.Restarts) != 0 {
				t.Fatalf("undisturbed run has restarts: %+v", base.Restarts)
			}
			t.Logf("%s undisturbed: %.2f%% after %d steps, %.1f s of training", m.name, 100*base.TestAccuracy, base.GlobalSteps, base.TrainSeconds)
			// The kills fall at fractions of the undisturbed run's steps.
			at := func(f float64) string { return fmt.Sprintf("step:%d", int64(f*float64(base.GlobalSteps))) }
			plan := "ps/0@" + at(0.15) + ",ps/1@" + at(0.35) + ",ps/0@" + at(0.55)
			t.Logf("fault plan for %d steps: %s", base.GlobalSteps, plan)
			rep, out := faultRun(t, ctx, t.TempDir(), append(args, "--fault", plan)...)
			if len(rep.Restarts) < 3 {
				t.Fatalf("%d restarts, want the 3 kills (training over before the last?): %+v\n%s", len(rep.Restarts), rep.Restarts, out)
			}
			tookOver := 0
			for _, rs := range rep.Restarts {
				if rs.StepsLost != 0 {
					t.Errorf("restart %+v lost %d steps, want 0", rs, rs.StepsLost)
				}
				if rs.TookOver != "" {
					tookOver++
					if rs.FailoverSeconds <= 0 || rs.FailoverSeconds > 0.5 {
						t.Errorf("failover of %s to %s took %.3f s, want (0, 0.5]", rs.Task, rs.TookOver, rs.FailoverSeconds)
					}
				}
				t.Logf("%s died at %.2f s, %q took over in %.3f s at step %d, %d steps lost",
					rs.Task, rs.KilledAtSeconds, rs.TookOver, rs.FailoverSeconds, rs.RestoredStep, rs.StepsLost)
			}
			// ps/0 and ps/1 were primaries when they died; ps/0's second
			// death was a standby's.
			if tookOver != 2 {
				t.Errorf("%d failovers, want 2 (ps/0 and ps/1 died as primaries): %+v", tookOver, rep.Restarts)
			}
			if !strings.Contains(out, "took over") {
				t.Errorf("the summary does not say which replica took over:\n%s", out)
			}
			if rep.StoppedBy != "epochs" || (m.name == "sync" && rep.GlobalSteps != base.GlobalSteps) {
				t.Errorf("stopped by %s after %d steps, want all %d", rep.StoppedBy, rep.GlobalSteps, base.GlobalSteps)
			}
			if d := math.Abs(rep.TestAccuracy - base.TestAccuracy); d > 0.003 {
				t.Errorf("test accuracy %.2f%% with primaries killed vs %.2f%% undisturbed: %.2f points apart, want <= 0.3",
					100*rep.TestAccuracy, 100*base.TestAccuracy, 100*d)
			}
			t.Logf("%s with 3 kills: %.2f%% (undisturbed %.2f%%), %d steps", m.name, 100*rep.TestAccuracy, 100*base.TestAccuracy, rep.GlobalSteps)
		})
	}
}
