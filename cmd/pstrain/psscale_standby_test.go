package main

// The multi-process test of parameter servers added and removed live in
// a run with hot standbys (docs/elastic.md, "With hot standbys"): `pstrain
// scale --ps` 2 -> 3 -> 1 during a sync run with --ps-replicas 1, and
// between the changes a kill -9 of a primary whose shard changed rows.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/launcher"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/transport/auth"
)

// TestScalePSWithStandbys, sync and async: 2 -> 3 PS, then, once ps/0
// (shard 0's primary, whose rows the change moved) has its standby
// attached again at the switch's epoch, ps/0 is killed: standby/0 takes
// over with 0 steps lost and nothing rolled back; then 3 -> 1. The
// report has both changes with 0 steps lost and pauses within the goal,
// the run trained its epochs each step once with an empty data ledger,
// and the removed slots' processes (both of shards 1 and 2) exited when
// told to.
func TestScalePSWithStandbys(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	t.Run("sync", func(t *testing.T) {
		scalePSWithStandbys(t, 8, "--mode", "sync", "--lr", "0.05")
	})
	t.Run("async", func(t *testing.T) {
		scalePSWithStandbys(t, 10, "--mode", "async", "--lr", "0.02")
	})
	t.Run("ssp", func(t *testing.T) {
		scalePSWithStandbys(t, 10, "--mode", "ssp", "--lr", "0.02")
	})
}

// scalePSWithStandbys is TestScalePSWithStandbys for a run of epochs
// epochs with args.
func scalePSWithStandbys(t *testing.T, epochs float64, args ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	run := startRun(t, ctx, dir, append([]string{"--batch", "64", "--data-fraction", "0.1", "--epochs", fmt.Sprint(epochs),
		"--lr-schedule", "constant", "--checkpoint-dir", filepath.Join(dir, "ck"), "--checkpoint-every", "0s",
		"--max-ps", "3", "--ps-replicas", "1"}, args...)...)
	run.waitTraining(60 * time.Second)

	if out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--ps", "3"); err != nil {
		t.Fatalf("pstrain scale --ps 3: %v\n%s", err, out)
	}
	waitPSChanges(run, 1)
	spec := runCluster(t, run)
	if len(spec.PS) != 3 || len(spec.Standby) != 3 {
		t.Fatalf("cluster file %+v: want 3 PS slots, each with a standby slot", spec)
	}
	// The switch initialised shard 0 at its next epoch: ps/0 attaches
	// standby/0 afresh, from a snapshot of its new rows, and the chief's
	// poll sees it attached after the switch (a primary lost before that
	// is restored from the boundary's checkpoint).
	chiefLog := filepath.Join(run.dir, "logs", "chief.log")
	attached := regexp.MustCompile(`msg="standby attached" .*shard=0 primary=ps/0 standby=standby/0 `)
	waitFor(t, run, 30*time.Second, "the chief seeing standby/0 attached after the switch", func() bool {
		b, _ := os.ReadFile(chiefLog)
		_, after, ok := strings.Cut(string(b), `msg="parameter servers changed"`)
		return ok && attached.MatchString(after)
	})
	killedAt := time.Now()
	if err := syscall.Kill(run.pid("ps/0"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, run, 30*time.Second, "standby/0 promoted", func() bool {
		st, err := psStatus(ctx, run.dir, spec.Standby[0])
		return err == nil && st.Role == "primary"
	})
	t.Logf("standby/0 serves %.2f s after ps/0's kill", time.Since(killedAt).Seconds())

	if out, err := runPstrain(t, "scale", "--run-dir", run.dir, "--ps", "1"); err != nil {
		t.Fatalf("pstrain scale --ps 1: %v\n%s", err, out)
	}
	waitPSChanges(run, 2)
	rep := run.finish(2 * time.Minute)

	got := checkPSChanges(t, rep, epochs)
	var removed []string
	failovers := 0
	for _, r := range rep.Restarts {
		switch {
		case r.Cause == launcher.CauseRemoved:
			removed = append(removed, r.Task)
		case r.Task == "ps/0" && r.TookOver == "standby/0":
			failovers++
			if r.StepsLost != 0 {
				t.Errorf("ps/0's failover %+v lost %d steps, want 0", r, r.StepsLost)
			}
			t.Logf("ps/0 killed at %.2f s: %s took over in %.3f s at step %d, %d steps lost",
				r.KilledAtSeconds, r.TookOver, r.FailoverSeconds, r.RestoredStep, r.StepsLost)
		default:
			t.Errorf("restart %+v: want only ps/0's failover and the removed processes", r)
		}
	}
	if failovers != 1 {
		t.Errorf("%d failovers of ps/0 to standby/0, want 1: %+v\nthe chief's replica lines:\n%s", failovers, rep.Restarts, replicaLines(chiefLog))
	}
	slices.Sort(removed)
	if want := []string{"ps/1", "ps/2", "standby/1", "standby/2"}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, c := range got {
		t.Logf("ps %d -> %d at step %d (asked at %.2f s, done at %.2f s): pause %.3f s, %d steps lost", c.From, c.To, c.Step,
			c.AskedSeconds, c.Seconds, *c.PauseSeconds, *c.StepsLost)
	}
	t.Logf("%d steps, %.2f%%, training %.1f s", rep.GlobalSteps, 100*rep.TestAccuracy, rep.TrainSeconds)
}

// replicaLines are the lines of the chief's log at path about standbys,
// promotions, restores and layout changes.
func replicaLines(path string) string {
	b, _ := os.ReadFile(path)
	var out []string
	re := regexp.MustCompile(`standby|promot|restor|primary|PS count change|parameter servers changed`)
	for _, l := range strings.Split(string(b), "\n") {
		if re.MatchString(l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// runCluster is the run's cluster file.
func runCluster(t *testing.T, run *liveRun) cluster.Spec {
	t.Helper()
	var spec cluster.Spec
	b, err := os.ReadFile(filepath.Join(run.dir, "cluster.json"))
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		t.Fatalf("cluster file: %v", err)
	}
	return spec
}

// psStatus is the Status of the PS process at addr, asked as the chief
// (with the run's token).
func psStatus(ctx context.Context, runDir, addr string) (*pb.StatusResponse, error) {
	token, err := auth.ReadTokenFile(filepath.Join(runDir, auth.TokenFile))
	if err != nil {
		return nil, err
	}
	asChief := &auth.Client{Keys: auth.NewKeyring(token), Role: auth.RoleChief}
	asChief.SetSession(1)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(asChief.Unary()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return pb.NewParameterServerClient(conn).Status(ctx, &pb.StatusRequest{})
}
