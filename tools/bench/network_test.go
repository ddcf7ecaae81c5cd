package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// fakeNetwork answers runs from a table keyed by link and the run's
// --compress, and records what it was asked.
type fakeNetwork struct {
	calls []string
	fail  map[string]error
}

func (f *fakeNetwork) Kind() string { return "fake links" }

func (f *fakeNetwork) Run(_ context.Context, link NetworkLink, limit time.Duration, args []string) (*report.Report, error) {
	i := slices.Index(args, "--compress")
	if i < 0 || i+1 == len(args) {
		return nil, fmt.Errorf("no --compress in %v", args)
	}
	key := link.Name + " " + args[i+1]
	f.calls = append(f.calls, key+" "+strings.Join(args[:i], " ")+" "+limit.String())
	if err := f.fail[key]; err != nil {
		return nil, err
	}
	ttt := 10 * link.Delay.Seconds()
	rep := &report.Report{TimeToTargetSeconds: &ttt, TestAccuracy: 0.98, StoppedBy: "target", EpochsDone: 2}
	rep.Wire.PushBytesPerStep, rep.Wire.PullBytesPerStep = 100, 200
	return rep, nil
}

func testPlan(r NetworkRunner, journal string) NetworkPlan {
	return NetworkPlan{Runner: r, Journal: journal, Compress: []string{"none", "int8"},
		Links:  []NetworkLink{{Name: "slow", Delay: time.Second}, {Name: "fast", Delay: time.Millisecond}},
		Models: []NetworkModel{{Name: "mlp", Args: []string{"--target-accuracy", "0.9"}, Target: 0.9, Cap: time.Minute}},
		Extra:  []string{"--epochs", "3"}, Load: func() float64 { return 7 }}
}

// TestNetworkGridAndJournal runs a grid on a fake runner: every run in
// the plan's order with its model's, the plan's and its compression's
// flags; a failed run is recorded and not journaled; a second section
// on the same journal runs only the failed one again.
func TestNetworkGridAndJournal(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "runs.jsonl")
	f := &fakeNetwork{fail: map[string]error{"fast int8": errors.New("boom")}}
	res, err := Network(context.Background(), testPlan(f, journal))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"slow none --target-accuracy 0.9 --epochs 3 1m0s", "slow int8 --target-accuracy 0.9 --epochs 3 1m0s",
		"fast none --target-accuracy 0.9 --epochs 3 1m0s", "fast int8 --target-accuracy 0.9 --epochs 3 1m0s"}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("runs %q, want %q", f.calls, want)
	}
	if res.Setup != "fake links" || len(res.Runs) != 4 {
		t.Fatalf("result %+v", res)
	}
	r := res.Runs[0]
	if r.Link != "slow" || r.Compress != "none" || r.Model != "mlp" || r.TimeToTargetSeconds == nil || *r.TimeToTargetSeconds != 10 ||
		r.TestAccuracy != 0.98 || r.TargetAccuracy != 0.9 || r.PullBytesPerStep != 200 || r.CapSeconds != 60 || r.LoadAverage != 7 {
		t.Errorf("first run %+v", r)
	}
	if e := res.Runs[3].Error; e != "boom" {
		t.Errorf("failed run's error %q, want boom", e)
	}

	f2 := &fakeNetwork{}
	res2, err := Network(context.Background(), testPlan(f2, journal))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"fast int8 --target-accuracy 0.9 --epochs 3 1m0s"}; !slices.Equal(f2.calls, want) {
		t.Fatalf("resumed section ran %q, want %q", f2.calls, want)
	}
	if len(res2.Runs) != 4 || res2.Runs[3].Error != "" || *res2.Runs[1].TimeToTargetSeconds != 10 {
		t.Errorf("resumed result %+v", res2.Runs)
	}
}

// TestNetworkSkipsAtOnce: a runner that cannot run on this machine ends
// the section at its first run, with the reason.
func TestNetworkSkipsAtOnce(t *testing.T) {
	f := &fakeNetwork{fail: map[string]error{"slow none": fmt.Errorf("%w: not root", ErrSkip)}}
	_, err := Network(context.Background(), testPlan(f, ""))
	if !errors.Is(err, ErrSkip) || !strings.Contains(err.Error(), "not root") || len(f.calls) != 1 {
		t.Fatalf("err %v after %d runs, want the skip after 1", err, len(f.calls))
	}
}

// TestNetworkAllFailed: a section whose every run failed is an error.
func TestNetworkAllFailed(t *testing.T) {
	boom := errors.New("boom")
	f := &fakeNetwork{fail: map[string]error{"slow none": boom, "slow int8": boom, "fast none": boom, "fast int8": boom}}
	res, err := Network(context.Background(), testPlan(f, ""))
	if err == nil || len(res.Runs) != 4 {
		t.Fatalf("err %v, %d runs", err, len(res.Runs))
	}
}
