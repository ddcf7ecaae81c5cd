package config

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/ml/partition"
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
		"--momentum NaN":          func(r *Run) { r.Momentum = math.NaN() },
		"--data-plane":            func(r *Run) { r.DataPlane = "udp" },
		"--nan-policy":            func(r *Run) { r.NaNPolicy = "" },
		"--optimizer":             func(r *Run) { r.Optimizer = "rmsprop" },
		"--data-fraction":         func(r *Run) { r.DataFraction = 1.5 },
		"--batch":                 func(r *Run) { r.Batch = 0 },
		"--target-accuracy":       func(r *Run) { r.TargetAccuracy = 97.5 },
		"--wire-dtype":            func(r *Run) { r.WireDType = "fp8" },
		"--data-plane-privacy":    func(r *Run) { r.DataPlanePrivacy = "none" },
		"--compress":              func(r *Run) { r.Compress = "topk:2" },
		"--compress unknown":      func(r *Run) { r.Compress = "fp8" },
		"--compress with bf16":    func(r *Run) { r.Compress, r.WireDType = "int8", BF16 },
		"--lr-schedule":           func(r *Run) { r.LRSchedule = "linear" },
		"--warmup-steps":          func(r *Run) { r.WarmupSteps = -1 },
		"--keep-archives":         func(r *Run) { r.KeepArchives = -2 },
		"--norm-guard":            func(r *Run) { r.NormGuard = 1.5 },
		"--norm-guard negative":   func(r *Run) { r.NormGuard = -20 },
		"--norm-guard NaN":        func(r *Run) { r.NormGuard = math.NaN() },
		"--norm-guard Inf":        func(r *Run) { r.NormGuard = math.Inf(1) },
		"--aggregate":             func(r *Run) { r.Aggregate = "median" },
		"--aggregate async":       func(r *Run) { r.Aggregate, r.Mode = TrimmedMean, Async },
		"--model":                 func(r *Run) { r.Model = "rnn" },
		"--conv for an MLP":       func(r *Run) { r.Conv = []int{16} },
		"--conv missing":          func(r *Run) { r.Model = "cnn" },
		"--conv zero":             func(r *Run) { r.Model, r.Conv = "cnn", []int{16, 0} },
		"--max-workers":           func(r *Run) { r.Workers, r.MaxWorkers = 4, 3 },
		"--max-workers too many":  func(r *Run) { r.MaxWorkers = MaxWorkerSlots + 1 },
		"--workers too many":      func(r *Run) { r.Workers = MaxWorkerSlots + 1 },
		"--ps-replicas":           func(r *Run) { r.PSReplicas = 2 },
		"--ps too many":           func(r *Run) { r.PS = partition.MaxShards + 1 },
		"--max-ps too many":       func(r *Run) { r.MaxPS = partition.MaxShards + 1 },
		"--ps-replicas negative":  func(r *Run) { r.PSReplicas = -1 },
	}
	for name, mutate := range cases {
		r := Default()
		mutate(&r)
		err := r.Validate()
		if flag, _, _ := strings.Cut(name, " "); err == nil || !strings.Contains(err.Error(), flag) {
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

// The typed options encode as the strings they always did: run
// configurations embedded in checkpoint manifests and reports, old and
// new, still parse, and one parsed and written again is the same JSON.
func TestRunConfigJSONIsUnchanged(t *testing.T) {
	// The run_config of a checkpoint manifest written before the options
	// were typed (run/bench/run/checkpoints/ckpt-000000000706).
	written := `{"mode":"sync","staleness":3,"replicas_to_aggregate":0,"ps":2,"workers":2,"hidden":[800],
		"batch":128,"lr":0.2,"momentum":0.9,"optimizer":"momentum","epochs":10,"target_accuracy":0.975,
		"dataset":"mnist","data_fraction":1,"seed":1,"nan_policy":"reject","data_plane":"tcp","wire_dtype":"f32",
		"lr_schedule":"step:2:0.3","warmup_steps":0,"data_dir":"data","eval_every":1000000000,
		"heartbeat_timeout":3000000000,"checkpoint_dir":"run/bench/run/checkpoints","checkpoint_every":"10s",
		"keep_checkpoints":3,"resume":true,"target_hold":3}`
	r, err := Parse([]byte(written))
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode != Sync || r.NaNPolicy != Reject || r.DataPlane != TCP || r.WireDType != F32 || r.Optimizer != "momentum" {
		t.Errorf("parsed %+v", r)
	}
	if err := r.Validate(); err != nil {
		t.Errorf("the manifest's run no longer validates: %v", err)
	}
	var was, is map[string]any
	if err := json.Unmarshal([]byte(written), &was); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(r.JSON(), &is); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(was, is) {
		t.Errorf("written again differently:\n was %v\n is  %v", was, is)
	}

	// The other values of each option, and a run written before these
	// options existed (as in old reports): they stay unset, as before.
	r, err = Parse([]byte(`{"mode":"ssp","workers":2,"optimizer":"adam","lr":0.5,"nan_policy":"skip","data_plane":"grpc","wire_dtype":"bf16"}`))
	if err != nil || r.Mode != SSP || r.NaNPolicy != Skip || r.DataPlane != GRPC || r.WireDType != BF16 || r.Optimizer != "adam" {
		t.Errorf("parsed %+v, %v", r, err)
	}
	r, err = Parse([]byte(`{"mode":"async","ps":1,"workers":2,"hidden":[8],"batch":4,"lr":0.5,"optimizer":"sgd"}`))
	if err != nil || r.Mode != Async || r.NaNPolicy != "" || r.DataPlane != "" || r.WireDType != "" || r.LRSchedule != "constant" {
		t.Errorf("parsed %+v, %v", r, err)
	}
}

// --model cnn makes a CNN spec reading the square input as an image; an
// MLP's configuration and spec are what they were before CNNs existed,
// and a CNN run differs from an MLP run in Diff by its kind.
func TestModelKindInSpecAndDiff(t *testing.T) {
	mlp := Default()
	if s := mlp.Spec(784, 10); s.IsCNN() || s.String() != "784-800-10" {
		t.Fatalf("default spec %s", s)
	}
	cnn := Default()
	cnn.Model, cnn.Conv, cnn.Hidden = "cnn", DefaultCNNConv, DefaultCNNHidden
	if err := cnn.Validate(); err != nil {
		t.Fatal(err)
	}
	s := cnn.Spec(784, 10)
	if err := s.Validate(); err != nil || s.String() != "cnn 28x28x1-c16-c32-256-10" {
		t.Fatalf("CNN spec %s: %v", s, err)
	}
	if err := cnn.Spec(785, 10).Validate(); err == nil {
		t.Fatal("a CNN on 785-pixel rows validated")
	}
	d := strings.Join(mlp.Diff(cnn), "; ")
	if !strings.Contains(d, "model: mlp (chief) vs cnn (this task)") || !strings.Contains(d, "conv: [] (chief) vs [16 32] (this task)") {
		t.Fatalf("Diff = %s", d)
	}
	back, err := Parse(cnn.JSON())
	if err != nil || !reflect.DeepEqual(back, cnn) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	named := mlp
	named.Model = "mlp"
	if back, _ := Parse(named.JSON()); back.Model != "" || len(mlp.Diff(back)) != 0 {
		t.Fatalf("\"mlp\" is not read as the MLP: %+v", back.Model)
	}
}

// The worker slots of an elastic run, and the replicas a sync step
// aggregates with another worker count (docs/elastic.md).
func TestWorkerSlotsAndReplicas(t *testing.T) {
	r := Default()
	if r.WorkerSlots() != 8 {
		t.Errorf("default slots %d, want 8", r.WorkerSlots())
	}
	r.Workers = 12
	if r.WorkerSlots() != 12 {
		t.Errorf("12 workers: slots %d, want 12", r.WorkerSlots())
	}
	r.Workers, r.MaxWorkers = 2, 4
	if r.WorkerSlots() != 4 || r.ReplicasFor(3) != 3 {
		t.Errorf("--max-workers 4: slots %d, replicas for 3 %d; want 4 and 3", r.WorkerSlots(), r.ReplicasFor(3))
	}
	r.Workers, r.ReplicasToAggregate = 3, 2 // one backup worker, kept
	if r.ReplicasFor(4) != 3 || r.ReplicasFor(1) != 1 || r.ReplicasFor(3) != r.Replicas() {
		t.Errorf("one backup worker: replicas for 4, 1, 3 = %d, %d, %d; want 3, 1, 2", r.ReplicasFor(4), r.ReplicasFor(1), r.ReplicasFor(3))
	}
}

// A task started with a different --ps-replicas than the chief's is
// refused at registration: the field is compared, and survives the JSON
// every task sends.
func TestPSReplicasIsCompared(t *testing.T) {
	a, b := Default(), Default()
	b.PSReplicas = 1
	if d := a.Diff(b); len(d) != 1 || d[0] != "ps_replicas: 0 (chief) vs 1 (this task)" {
		t.Fatalf("Diff = %q", d)
	}
	r, err := Parse(b.JSON())
	if err != nil || r.PSReplicas != 1 || r.Standbys() != b.PS {
		t.Fatalf("JSON round trip: %+v, %v", r, err)
	}
	if a.Standbys() != 0 {
		t.Fatalf("Standbys without replicas = %d", a.Standbys())
	}
}

func ctrRun() Run {
	r := Default()
	r.Model, r.Hidden, r.Dataset = "ctr", DefaultCTRHidden, "synth-ctr"
	r.EmbeddingDim, r.EmbeddingOptimizer, r.EmbeddingLR = DefaultEmbeddingDim, DefaultEmbeddingOptimizer, DefaultEmbeddingLR
	return r
}

func TestCTRRun(t *testing.T) {
	r := ctrRun()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	s := r.CTRSpec(13, 26)
	if err := s.Validate(); err != nil || s.String() != "ctr 13+26x16-128-64-1" {
		t.Errorf("CTRSpec = %s, %v", s, err)
	}
	if rule := r.EmbeddingRule(); rule.Kind != "adagrad" || rule.LR != 2 || rule.Validate() != nil {
		t.Errorf("EmbeddingRule = %+v", rule)
	}
	r.EmbeddingOptimizer = "momentum"
	if rule := r.EmbeddingRule(); rule.Momentum != 0.9 || rule.Validate() != nil {
		t.Errorf("momentum EmbeddingRule = %+v", rule)
	}
	if r.EmbeddingPrefill = 1000; r.Validate() != nil {
		t.Errorf("a CTR run pre-filling its tables: %v", r.Validate())
	}
	r.EmbeddingPrefill = 0
	if lr := DefaultLR(r.Model, Async, 2); lr != DefaultCTRLR/2 {
		t.Errorf("async CTR default lr %v", lr)
	}
	for name, mod := range map[string]func(*Run){
		"embedding-dim 0":     func(r *Run) { r.EmbeddingDim = 0 },
		"embedding-dim huge":  func(r *Run) { r.EmbeddingDim = MaxEmbeddingDim + 1 },
		"optimizer adam":      func(r *Run) { r.EmbeddingOptimizer = "adam" },
		"lr 0":                func(r *Run) { r.EmbeddingLR = 0 },
		"lr NaN":              func(r *Run) { r.EmbeddingLR = math.NaN() },
		"mnist":               func(r *Run) { r.Dataset = "mnist" },
		"conv":                func(r *Run) { r.Conv = []int{4} },
		"an MLP's embeddings": func(r *Run) { r.Model, r.Dataset = "", "mnist" },
		"an MLP on CTR data":  func(r *Run) { r.Model, r.EmbeddingDim, r.EmbeddingOptimizer, r.EmbeddingLR = "", 0, "", 0 },
		"prefill negative":    func(r *Run) { r.EmbeddingPrefill = -1 },
		"an MLP's prefill": func(r *Run) {
			r.Model, r.Dataset, r.EmbeddingDim, r.EmbeddingOptimizer, r.EmbeddingLR, r.EmbeddingPrefill = "", "mnist", 0, "", 0, 10
		},
	} {
		r := ctrRun()
		mod(&r)
		if r.Validate() == nil {
			t.Errorf("%s: validated", name)
		}
	}
}
