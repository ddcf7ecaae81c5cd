package shardckpt

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
)

// writeCheckpoint writes spec's variables (and adam state derived from
// them) as a checkpoint of `shards` shards and returns it opened.
func writeCheckpoint(t *testing.T, spec model.Spec, vars [][]float32, shards int) *checkpoint.Checkpoint {
	t.Helper()
	store, m := writeShards(t, spec, vars, shards)
	return commitAndLoad(t, store, m)
}

// commitAndLoad commits m and returns its checkpoint opened.
func commitAndLoad(t *testing.T, store *checkpoint.Store, m checkpoint.Manifest) *checkpoint.Checkpoint {
	t.Helper()
	if err := store.Commit(m); err != nil {
		t.Fatal(err)
	}
	ck, err := store.Load(store.Path(m.Step))
	if err != nil {
		t.Fatal(err)
	}
	return ck
}

// writeShards writes the shard files of writeCheckpoint's checkpoint and
// returns the manifest that commits them.
func writeShards(t *testing.T, spec model.Spec, vars [][]float32, shards int) (*checkpoint.Store, checkpoint.Manifest) {
	t.Helper()
	plan, err := partition.New(spec, shards)
	if err != nil {
		t.Fatal(err)
	}
	store := checkpoint.NewStore(checkpoint.NewMemFS(), "/ck", 0)
	m := checkpoint.Manifest{Step: 7, Version: 7, Mode: "sync", Optimizer: checkpoint.Optimizer{Name: "adam"}, ModelSpec: spec.JSON()}
	for s := range plan.Shards {
		size := plan.Shards[s].Size
		params := make([]float32, size)
		plan.Gather(s, vars, params)
		opt := make([]float32, 2*size)
		for i, p := range params {
			opt[i], opt[size+i] = -p, 2*p // m = -p, v = 2p: recognisable
		}
		tensors, err := Tensors(plan, s, "adam", params, opt)
		if err != nil {
			t.Fatal(err)
		}
		info, err := store.WriteShard(7, s, shards, tensors, map[string]string{MetaOptimizer: "adam", MetaOptimizerSteps: strconv.Itoa(10 + s)})
		if err != nil {
			t.Fatal(err)
		}
		m.Shards = append(m.Shards, info)
	}
	return store, m
}

// The dense tensors a commit read as it checked the files
// (checkpoint.Store.CommitReading with Dense) give what reading the
// committed checkpoint gives.
func TestReadFromTheCommitsReadIsRead(t *testing.T) {
	spec := model.Spec{Input: 30, Hidden: []int{20, 10}, Classes: 5}
	vars := spec.Init(3)
	store, m := writeShards(t, spec, vars, 3)
	files, err := store.CommitReading(m, -1, Dense)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := store.Load(store.Path(7))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadFrom(ck, spec, "adam", files)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Read(ck, spec, "adam")
	if err != nil {
		t.Fatal(err)
	}
	if got.OptimizerSteps != want.OptimizerSteps || got.OptimizerSteps != 12 {
		t.Fatalf("optimizer steps %d, Read's %d, want 12", got.OptimizerSteps, want.OptimizerSteps)
	}
	for v := range vars {
		if !slices.Equal(got.Vars[v], vars[v]) || !slices.Equal(got.Slots[0][v], want.Slots[0][v]) || !slices.Equal(got.Slots[1][v], want.Slots[1][v]) {
			t.Fatalf("variable %d or its state differs from Read's", v)
		}
	}
	if _, err := ReadFrom(ck, spec, "adam", files[:2]); err == nil {
		t.Fatal("ReadFrom took the files of 2 shards for a checkpoint of 3")
	}
}

func TestRoundTripAcrossShardCounts(t *testing.T) {
	spec := model.Spec{Input: 30, Hidden: []int{20, 10}, Classes: 5}
	vars := spec.Init(3)
	ck := writeCheckpoint(t, spec, vars, 2)
	if got := ck.Manifest.Shards[0].Tensors[0]; !strings.HasPrefix(got, "layer0/w[0:") {
		t.Errorf("first tensor is %q, want a layer0/w row block", got)
	}
	st, err := Read(ck, spec, "adam")
	if err != nil {
		t.Fatal(err)
	}
	for v := range vars {
		if !slices.Equal(st.Vars[v], vars[v]) {
			t.Fatalf("variable %d differs after the round trip", v)
		}
	}
	if st.OptimizerSteps != 11 {
		t.Errorf("optimizer steps %d, want the largest shard's 11", st.OptimizerSteps)
	}
	// Restore onto 3 shards: each shard's slice equals a direct gather.
	plan3, err := partition.New(spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	for s := range plan3.Shards {
		params, opt := st.Shard(plan3, s)
		want := make([]float32, plan3.Shards[s].Size)
		plan3.Gather(s, vars, want)
		if !slices.Equal(params, want) {
			t.Fatalf("shard %d of 3: parameters differ", s)
		}
		size := len(want)
		for i, p := range want {
			if opt[i] != -p || opt[size+i] != 2*p {
				t.Fatalf("shard %d of 3: optimizer state %d is (%v, %v), want (%v, %v)", s, i, opt[i], opt[size+i], -p, 2*p)
			}
		}
	}
}

func TestReadRefusesAnotherModel(t *testing.T) {
	spec := model.Spec{Input: 30, Hidden: []int{20}, Classes: 5}
	ck := writeCheckpoint(t, spec, spec.Init(1), 2)
	other := model.Spec{Input: 30, Hidden: []int{21}, Classes: 5}
	if _, err := Read(ck, other, "adam"); err == nil || !strings.Contains(err.Error(), "holds model 30-20-5, the run trains 30-21-5") {
		t.Fatalf("reading for another model: err = %v, want a model mismatch", err)
	}
	if _, err := Read(ck, spec, "momentum"); err == nil || !strings.Contains(err.Error(), "adam optimizer state") {
		t.Fatalf("reading for another optimizer: err = %v", err)
	}
}

func TestTensorsChecksSizes(t *testing.T) {
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, _ := partition.New(spec, 1)
	n := plan.Shards[0].Size
	if _, err := Tensors(plan, 0, "momentum", make([]float32, n), make([]float32, n-1)); err == nil {
		t.Error("short optimizer state accepted")
	}
	if _, err := Tensors(plan, 0, "sgd", make([]float32, n+1), nil); err == nil {
		t.Error("wrong parameter count accepted")
	}
	ts, err := Tensors(plan, 0, "momentum", make([]float32, n), make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2*len(plan.Shards[0].Blocks) {
		t.Errorf("%d tensors, want a parameter and a momentum tensor per block", len(ts))
	}
}

// A CNN checkpoint names its kernels by output-channel range
// ("conv0/w[0:16]") and restores onto any PS count, and is refused for an
// MLP (and an MLP's for a CNN).
func TestCNNRoundTripAcrossShardCounts(t *testing.T) {
	spec := model.Spec{Kind: model.KindCNN, Input: 784, Height: 28, Width: 28, Conv: []int{16, 32}, Hidden: []int{256}, Classes: 10}
	vars := spec.Init(4)
	ck := writeCheckpoint(t, spec, vars, 2)
	var names []string
	for _, sh := range ck.Manifest.Shards {
		names = append(names, sh.Tensors...)
	}
	for _, want := range []string{"conv0/w[0:16]", "conv0/b[0:1]", "conv1/w[0:32]", "dense1/w[0:256]"} {
		if !slices.Contains(names, want) {
			t.Errorf("no tensor %q among %v", want, names)
		}
	}
	st, err := Read(ck, spec, "adam")
	if err != nil {
		t.Fatal(err)
	}
	for v := range vars {
		if !slices.Equal(st.Vars[v], vars[v]) {
			t.Fatalf("variable %d differs after the round trip", v)
		}
	}
	for _, n := range []int{1, 3, 4} {
		plan, err := partition.New(spec, n)
		if err != nil {
			t.Fatal(err)
		}
		for s := range plan.Shards {
			params, opt := st.Shard(plan, s)
			want := make([]float32, plan.Shards[s].Size)
			plan.Gather(s, vars, want)
			if !slices.Equal(params, want) {
				t.Fatalf("shard %d of %d: parameters differ", s, n)
			}
			if opt[0] != -want[0] || opt[len(want)] != 2*want[0] {
				t.Fatalf("shard %d of %d: optimizer state not restored", s, n)
			}
		}
	}
	mlp := model.Spec{Input: 784, Hidden: []int{256}, Classes: 10}
	if _, err := Read(ck, mlp, "adam"); err == nil || !strings.Contains(err.Error(), "holds model cnn 28x28x1-c16-c32-256-10, the run trains 784-256-10") {
		t.Fatalf("reading a CNN checkpoint for an MLP: err = %v", err)
	}
}
