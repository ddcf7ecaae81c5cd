package config

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateRejectsImpossibleValues(t *testing.T) {
	cases := map[string]func(*Run){
		"--ps":                    func(r *Run) { r.PS = 0 },
		"--workers":               func(r *Run) { r.Workers = 0 },
		"--replicas-to-aggregate": func(r *Run) { r.ReplicasToAggregate = 3 },
		"--mode":                  func(r *Run) { r.Mode = "bsp" },
		"--hidden":                func(r *Run) { r.Hidden = []int{800, 0} },
		"--lr":                    func(r *Run) { r.LR = 0 },
		"--momentum":              func(r *Run) { r.Momentum = 1 },
		"--optimizer":             func(r *Run) { r.Optimizer = "rmsprop" },
		"--data-fraction":         func(r *Run) { r.DataFraction = 1.5 },
		"--batch":                 func(r *Run) { r.Batch = 0 },
		"--target-accuracy":       func(r *Run) { r.TargetAccuracy = 97.5 },
		"--wire-dtype":            func(r *Run) { r.WireDType = "fp8" },
		"--lr-schedule":           func(r *Run) { r.LRSchedule = "linear" },
		"--warmup-steps":          func(r *Run) { r.WarmupSteps = -1 },
	}
	for flag, mutate := range cases {
		r := Default()
		mutate(&r)
		err := r.Validate()
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: got %v, want an error naming the flag", flag, err)
		}
	}
}

func TestDiffNamesFieldsAndIgnoresLocalOnes(t *testing.T) {
	a, b := Default(), Default()
	b.LR = 0.05
	b.Hidden = []int{256, 128}
	b.DataDir = "/elsewhere" // local to the task: not compared
	d := a.Diff(b)
	if len(d) != 2 || !strings.HasPrefix(d[0], "hidden:") || !strings.HasPrefix(d[1], "lr: 0.2 (chief) vs 0.05") {
		t.Fatalf("Diff = %q", d)
	}
	r, err := Parse(a.JSON())
	if err != nil || len(a.Diff(r)) != 0 {
		t.Fatalf("JSON round trip: %v %v", err, a.Diff(r))
	}
}

func TestParseEvery(t *testing.T) {
	for in, want := range map[string]Every{
		"30s": {Duration: 30 * time.Second}, "2m": {Duration: 2 * time.Minute},
		"500": {Steps: 500}, "500steps": {Steps: 500}, "0": {},
	} {
		got, err := ParseEvery(in)
		if err != nil || got != want {
			t.Errorf("ParseEvery(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if back, err := ParseEvery(got.String()); err != nil || back != got {
			t.Errorf("%q does not survive String: %q -> %+v, %v", in, got.String(), back, err)
		}
	}
	for _, bad := range []string{"", "-3", "soon", "-1s", "5 minutes"} {
		if _, err := ParseEvery(bad); err == nil {
			t.Errorf("ParseEvery(%q) accepted", bad)
		}
	}
	r := Default()
	r.CheckpointEvery = Every{Steps: 42}
	back, err := Parse(r.JSON())
	if err != nil || back.CheckpointEvery != r.CheckpointEvery {
		t.Errorf("JSON round trip of the interval: %+v, %v", back.CheckpointEvery, err)
	}
}

func TestOneOfNamesEveryChoice(t *testing.T) {
	for _, c := range []struct {
		want []string
		msg  string
	}{
		{[]string{"grpc", "tcp"}, `--x must be grpc or tcp, got "udp"`},
		{[]string{"sync", "async", "ssp"}, `--x must be sync, async or ssp, got "udp"`},
	} {
		if err := oneOf("--x", "udp", c.want...); err == nil || err.Error() != c.msg {
			t.Errorf("oneOf(%v) = %v, want %s", c.want, err, c.msg)
		}
		if err := oneOf("--x", c.want[1], c.want...); err != nil {
			t.Errorf("oneOf refused %q: %v", c.want[1], err)
		}
	}
}

func TestLRScheduleValidationAndCompatibility(t *testing.T) {
	for _, ok := range []string{"constant", "cosine", "step:1:0.5", "step:2.5:0.3"} {
		r := Default()
		r.LRSchedule, r.WarmupSteps = ok, 100
		if err := r.Validate(); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	r := Default()
	r.LRSchedule = "step:x:0.5"
	if err := r.Validate(); err == nil || !strings.HasPrefix(err.Error(), `--lr-schedule "step:x:0.5": EPOCHS`) {
		t.Errorf("step:x:0.5: %v", err)
	}
	// Both are compared at registration.
	a, b := Default(), Default()
	b.LRSchedule, b.WarmupSteps = "cosine", 50
	if d := a.Diff(b); len(d) != 2 || !strings.HasPrefix(d[0], "lr_schedule: step:2:0.3 (chief) vs cosine") || !strings.HasPrefix(d[1], "warmup_steps: 0 (chief) vs 50") {
		t.Errorf("Diff = %q", d)
	}
	// A configuration written before schedules existed reads as constant.
	constant := Default()
	constant.LRSchedule = "constant"
	old := strings.Replace(string(constant.JSON()), `"lr_schedule":"constant",`, "", 1)
	if old == string(constant.JSON()) {
		t.Fatal("test setup: lr_schedule not found in the JSON")
	}
	back, err := Parse([]byte(old))
	if err != nil || len(constant.Diff(back)) != 0 {
		t.Errorf("old configuration: %v, diff %q", err, Default().Diff(back))
	}
}
