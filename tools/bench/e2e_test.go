package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas/gonum"

	"github.com/pstrain/pstrain/observe/report"
)

// fakeRunner answers with a report derived from the flags and fails the
// runs whose flags contain failOn.
type fakeRunner struct {
	calls      [][]string
	failOn     string
	failTarget bool
}

func (f *fakeRunner) Run(ctx context.Context, args []string) (*report.Report, time.Duration, error) {
	f.calls = append(f.calls, args)
	if (f.failTarget && len(args) == 0) || (f.failOn != "" && strings.Contains(strings.Join(args, " "), f.failOn)) {
		return nil, time.Second, errors.New("task died")
	}
	ttt := 9.25
	rep := &report.Report{Mode: "sync", Batch: 128, ReplicasToAggregate: 2, Model: "784-800-10", PS: 2, Workers: 2, Optimizer: "momentum", TargetAccuracy: 0.975,
		TimeToTargetSeconds: &ttt, StartupSeconds: 1.5, TrainSeconds: 10, SamplesPerSecond: 1000 * float64(len(f.calls)),
		TestAccuracy: 0.976, GlobalSteps: 700,
		Tasks: map[string]report.Task{"ps/0": {PeakRSSBytes: 60 << 20}, "ps/1": {PeakRSSBytes: 61 << 20},
			"worker/0": {PeakRSSBytes: 90 << 20}, "worker/1": {PeakRSSBytes: 95 << 20}, "chief": {PeakRSSBytes: 130 << 20}}}
	return rep, 12 * time.Second, nil
}

func TestEndToEndGridAndTarget(t *testing.T) {
	f := &fakeRunner{failOn: "--workers 4"}
	res, target, err := EndToEnd(context.Background(), E2EConfig{Runner: f, Target: true,
		Modes: []string{"sync", "async"}, PS: []int{1}, Workers: []int{2, 4}, GridEpochs: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.calls) != 5 || len(f.calls[0]) != 0 {
		t.Fatalf("calls = %q; want the default run (no flags) then 4 grid runs", f.calls)
	}
	if want := []string{"--mode", "async", "--ps", "1", "--workers", "2", "--epochs", "0.3", "--target-accuracy", "0", "--eval-every", "0s", "--lr", "0.05"}; !slices.Equal(f.calls[3], want) {
		t.Errorf("grid run flags = %q, want %q", f.calls[3], want)
	}
	if target == nil || res.TimeToTargetSeconds == nil || *res.TimeToTargetSeconds != 9.25 || res.WallSeconds != 12 ||
		res.StartupSeconds != 1.5 || res.SamplesPerSecond != 1000 || res.TargetAccuracy != 0.975 {
		t.Fatalf("target figures = %+v", res)
	}
	if len(res.Runs) != 4 {
		t.Fatalf("runs = %+v", res.Runs)
	}
	if n := len(f.calls[1]); f.calls[1][n-2] == "--lr" {
		t.Errorf("sync grid run %q sets --lr; only async and ssp do", f.calls[1])
	}
	if r := res.Runs[0]; r.Mode != "sync" || r.Workers != 2 || r.SamplesPerSecond != 2000 || r.Error != "" ||
		r.TrainSeconds != 10 || r.GlobalSteps != 700 || r.WallSeconds != 12 {
		t.Errorf("first grid row = %+v", r)
	}
	if r := res.Runs[1]; r.Workers != 4 || r.Error == "" || r.SamplesPerSecond != 0 {
		t.Errorf("failed row = %+v, want the error recorded", r)
	}
	if _, _, err := EndToEnd(context.Background(), E2EConfig{Runner: &fakeRunner{failOn: ""}, Target: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := EndToEnd(context.Background(), E2EConfig{Runner: &fakeRunner{failOn: " "}, Target: true,
		Modes: []string{"sync"}, PS: []int{1}, Workers: []int{1}}); err != nil {
		t.Fatalf("grid failure must not fail the section: %v", err)
	}
}

func TestRunEndToEndAndMemoryWithFakeRunner(t *testing.T) {
	f := &fakeRunner{}
	res, err := Run(context.Background(), Config{Sections: []string{SectionMemory}, Spec: mnistMLP, Batches: []int{128},
		Budget: time.Millisecond, Rounds: 1, Runner: f})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.calls) != 1 {
		t.Fatalf("memory alone made %d runs, want only the default cluster's", len(f.calls))
	}
	if res.EndToEnd != nil || res.Memory == nil || len(res.Memory.Shards) != 2 || len(res.Errors) != 0 {
		t.Fatalf("result = %+v", res)
	}
	var sb strings.Builder
	if err := WriteTable(&sb, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "memory: PS RSS / state") || !strings.Contains(sb.String(), "ps/1") ||
		!regexp.MustCompile(`worker +2 +95\.0 +120 +true`).MatchString(sb.String()) ||
		!regexp.MustCompile(`chief +1 +130\.0 +120 +false`).MatchString(sb.String()) {
		t.Errorf("table:\n%s", sb.String())
	}
	// Every role's peak RSS, from the default cluster's run.
	m := res.Memory
	if m.Roles.Worker != (MemoryRole{Tasks: 2, PeakRSSBytes: 95 << 20, GoalBytes: RoleGoalBytes, MeetsGoal: true}) ||
		m.Roles.Chief != (MemoryRole{Tasks: 1, PeakRSSBytes: 130 << 20, GoalBytes: RoleGoalBytes, MeetsGoal: false}) ||
		m.Roles.PS.Tasks != 2 || m.Roles.PS.PeakRSSBytes != 61<<20 || m.Roles.PS.MeetsGoal != m.MeetsGoal || m.TotalPeakRSSBytes != (60+61+90+95+130)<<20 {
		t.Errorf("roles: %+v total %d", m.Roles, m.TotalPeakRSSBytes)
	}

	res, err = Run(context.Background(), Config{Sections: []string{SectionEndToEnd, SectionMemory}, Quick: true,
		Spec: mnistMLP, Batches: []int{128}, BLAS: gonum.Implementation{}, Budget: time.Millisecond, Rounds: 1, Runner: &fakeRunner{}})
	if err != nil || res.EndToEnd == nil || len(res.EndToEnd.Runs) != 4 || res.Memory == nil {
		t.Fatalf("quick e2e = %+v, %v; want 4 grid runs and memory", res, err)
	}

	// A failing target run fails both sections without failing Run.
	res, err = Run(context.Background(), Config{Sections: []string{SectionEndToEnd, SectionMemory},
		Spec: mnistMLP, Batches: []int{128}, BLAS: gonum.Implementation{}, Budget: time.Millisecond, Rounds: 1, Runner: &fakeRunner{failTarget: true}})
	if err != nil || res.EndToEnd != nil || res.Memory != nil || res.Errors[SectionEndToEnd] == "" || res.Errors[SectionMemory] == "" {
		t.Fatalf("failed target run: %+v, %v", res, err)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Sections: []string{SectionWire}, Spec: mnistMLP, Batches: []int{128}, Budget: time.Second, Rounds: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"no sections":     func(c *Config) { c.Sections = nil },
		"bad section":     func(c *Config) { c.Sections = []string{"disk"} },
		"no batches":      func(c *Config) { c.Batches = nil },
		"zero batch":      func(c *Config) { c.Batches = []int{0} },
		"zero budget":     func(c *Config) { c.Budget = 0 },
		"zero rounds":     func(c *Config) { c.Rounds = 0 },
		"e2e no runner":   func(c *Config) { c.Sections = []string{SectionEndToEnd} },
		"compute no BLAS": func(c *Config) { c.Sections = []string{SectionCompute} },
	} {
		c := ok
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestExecRunner runs a stand-in for the binary that checks its flags and
// writes a report where --report says.
func TestExecRunner(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "fake-pstrain")
	script := `#!/bin/sh
[ "$1" = run ] || { echo "want run, got $1"; exit 3; }
shift
while [ $# -gt 0 ]; do
  case "$1" in
    --report) rep="$2"; shift ;;
    --data-dir) [ "$2" = /data ] || { echo "data dir $2"; exit 3; }; shift ;;
    --mode) [ "$2" = boom ] && { echo "exploded"; exit 1; }; shift ;;
    --model=*) model="${1#--model=}" ;;
  esac
  shift
done
echo '{"mode":"sync","ps":1,"model":"'"$model"'","samples_per_second":1234.5,"time_to_target_seconds":null}' > "$rep"
`
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &ExecRunner{Exe: exe, Dir: filepath.Join(dir, "work"), DataDir: "/data"}
	rep, wall, err := r.Run(context.Background(), []string{"--mode", "sync"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.SamplesPerSecond != 1234.5 || rep.TimeToTargetSeconds != nil || wall <= 0 {
		t.Fatalf("report %+v, wall %v", rep, wall)
	}
	_, _, err = r.Run(context.Background(), []string{"--mode", "boom"})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "work", "run02", "run.log")) {
		t.Fatalf("failing run: err = %v, want the log path named", err)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "work", "run02", "run.log"))
	if !strings.Contains(string(log), "exploded") {
		t.Errorf("run.log = %q, want the child's output", log)
	}
	if rep.Model != "" {
		t.Errorf("a runner without Model passed model %q", rep.Model)
	}
	// Model's flags reach every run (bench --model cnn's cluster runs).
	r.Model = []string{"--model=cnn"}
	if rep, _, err = r.Run(context.Background(), []string{"--mode", "sync"}); err != nil {
		t.Fatal(err)
	}
	if rep.Model != "cnn" {
		t.Fatalf("a runner with Model: report model %q, want cnn", rep.Model)
	}
}
