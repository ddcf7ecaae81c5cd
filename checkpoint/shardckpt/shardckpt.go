// Package shardckpt maps a parameter-server shard's state (its flat
// parameter buffer and optimizer state) to named checkpoint tensors, and a
// checkpoint back to the whole model's state.
//
// Each block of the partition plan becomes one tensor named after its
// variable and row range, e.g. "layer0/w[0:392]" with shape [392, 800], so
// a numpy or PyTorch user can read a shard file without pstrain. The
// optimizer's state for the block follows as "layer0/w[0:392]/momentum"
// (or "/m" and "/v" for Adam). Reading reassembles whole variables, so a
// checkpoint written by S shards can be restored onto any number of
// shards.
package shardckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/internal/parallel"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
)

// ErrMismatch is wrapped by Read's error when the checkpoint is of
// another model or optimizer than the one asked for.
var ErrMismatch = errors.New("checkpoint is of another model or optimizer")

// Metadata keys written into every shard file.
const (
	MetaOptimizer      = "optimizer"
	MetaOptimizerSteps = "optimizer_steps"
	MetaVersion        = "version"
	MetaRunID          = "run_id"
)

// SlotNames names the optimizer's state slots, in the order of its flat
// state (optim.Optimizer.State).
func SlotNames(optimizer string) []string {
	switch optimizer {
	case "momentum":
		return []string{"momentum"}
	case "adam":
		return []string{"m", "v"}
	}
	return nil
}

func blockName(v model.Variable, b partition.Block) string {
	return v.Name + "[" + strconv.Itoa(b.RowStart) + ":" + strconv.Itoa(b.RowEnd) + "]"
}

// Tensors names shard s's parameters and optimizer state. The tensors
// share memory with params and optState. optState holds len(slots) slots
// of the shard's size, one after the other.
func Tensors(plan partition.Plan, s int, optimizer string, params, optState []float32) ([]checkpoint.Tensor, error) {
	if s < 0 || s >= len(plan.Shards) {
		return nil, fmt.Errorf("shardckpt: shard %d of %d", s, len(plan.Shards))
	}
	sh := plan.Shards[s]
	slots := SlotNames(optimizer)
	if len(params) != sh.Size {
		return nil, fmt.Errorf("shardckpt: shard %d has %d parameters, plan says %d", s, len(params), sh.Size)
	}
	if len(optState) != len(slots)*sh.Size {
		return nil, fmt.Errorf("shardckpt: %s state has %d values, want %d", optimizer, len(optState), len(slots)*sh.Size)
	}
	out := make([]checkpoint.Tensor, 0, len(sh.Blocks)*(1+len(slots)))
	off := 0
	for _, b := range sh.Blocks {
		v := plan.Vars[b.Var]
		n := (b.RowEnd - b.RowStart) * v.Cols
		name := blockName(v, b)
		shape := []int{b.RowEnd - b.RowStart, v.Cols}
		out = append(out, checkpoint.Tensor{Name: name, Shape: shape, Data: params[off : off+n]})
		for k, slot := range slots {
			base := k * sh.Size
			out = append(out, checkpoint.Tensor{Name: name + "/" + slot, Shape: shape, Data: optState[base+off : base+off+n]})
		}
		off += n
	}
	return out, nil
}

// State is a whole model's training state read from a checkpoint.
type State struct {
	Vars [][]float32 // by model variable
	// Slots holds the optimizer state: Slots[k][v] is slot k of variable v.
	Slots     [][][]float32
	Optimizer string
	// OptimizerSteps is the optimizer's step count (the largest over the
	// shards; they differ only in async mode).
	OptimizerSteps int64
}

// Read loads every shard of ck (verifying each file's SHA-256) and
// reassembles the model's variables and optimizer state for spec (its
// shards are of the layout the manifest records: a rebalanced one's
// weights, or equal shares). Embedding rows are hashed with the rest of
// a file, not kept (ReadTables reads them). The files are read side by
// side, on up to GOMAXPROCS goroutines.
func Read(ck *checkpoint.Checkpoint, spec model.Spec, optimizer string) (State, error) {
	return read(ck, spec, optimizer, func(n int) []shardFile {
		return readAll(n, func(s int) shardFile {
			var f shardFile
			f.tensors, f.meta, f.err = ck.ReadShardSome(s, Dense)
			return f
		})
	})
}

// ReadFrom is Read of shard files already read and verified, in the
// manifest's order: what checkpoint.Store.CommitReading returned for
// ck with Dense.
func ReadFrom(ck *checkpoint.Checkpoint, spec model.Spec, optimizer string, files []checkpoint.ShardRead) (State, error) {
	if len(files) != len(ck.Manifest.Shards) {
		return State{}, fmt.Errorf("shardckpt: %d shard files read of the %d of %s", len(files), len(ck.Manifest.Shards), ck.Path)
	}
	return read(ck, spec, optimizer, func(int) []shardFile {
		out := make([]shardFile, len(files))
		for s, f := range files {
			out[s] = shardFile{tensors: f.Tensors, meta: f.Meta}
		}
		return out
	})
}

// Dense says whether a tensor of a shard file is of the dense model
// (not an embedding table's): what Read keeps.
func Dense(name string) bool { return !strings.HasPrefix(name, TablePrefix) }

// read is Read of the files files gives for the manifest's n shards.
func read(ck *checkpoint.Checkpoint, spec model.Spec, optimizer string, files func(n int) []shardFile) (State, error) {
	if err := checkModelSpec(ck, spec); err != nil {
		return State{}, err
	}
	plan, err := partition.LayoutOf(ck.Manifest.NumShards, ck.Manifest.ShardWeights).Plan(spec)
	if err != nil {
		return State{}, err
	}
	slots := SlotNames(optimizer)
	st := newState(plan, optimizer, len(slots))
	read := files(len(ck.Manifest.Shards))
	for s := range ck.Manifest.Shards {
		if err := st.readShard(ck, plan, s, slots, read[s]); err != nil {
			return State{}, err
		}
	}
	return st, nil
}

// checkModelSpec fails with ErrMismatch when ck records a model other than
// spec; a checkpoint that records none passes.
func checkModelSpec(ck *checkpoint.Checkpoint, spec model.Spec) error {
	if len(ck.Manifest.ModelSpec) == 0 {
		return nil
	}
	var theirs model.Spec
	if err := json.Unmarshal(ck.Manifest.ModelSpec, &theirs); err != nil {
		return fmt.Errorf("shardckpt: %s: model spec: %w", ck.Path, err)
	}
	if theirs.String() != spec.String() {
		return fmt.Errorf("%w: %s holds model %s, the run trains %s", ErrMismatch, ck.Path, theirs, spec)
	}
	return nil
}

// newState allocates zeroed variables and nSlots optimizer slots of every
// variable of plan.
func newState(plan partition.Plan, optimizer string, nSlots int) State {
	st := State{Optimizer: optimizer, Vars: make([][]float32, len(plan.Vars)), Slots: make([][][]float32, nSlots)}
	for i, v := range plan.Vars {
		st.Vars[i] = make([]float32, v.Size())
	}
	for k := range st.Slots {
		st.Slots[k] = make([][]float32, len(plan.Vars))
		for i, v := range plan.Vars {
			st.Slots[k][i] = make([]float32, v.Size())
		}
	}
	return st
}

// readShard reads shard s of ck and copies its blocks of the variables
// and of each optimizer slot into st.
func (st *State) readShard(ck *checkpoint.Checkpoint, plan partition.Plan, s int, slots []string, f shardFile) error {
	file := ck.Manifest.Shards[s].File
	tensors, meta, err := f.tensors, f.meta, f.err
	if err != nil {
		return err
	}
	if got := meta[MetaOptimizer]; got != "" && got != st.Optimizer {
		return fmt.Errorf("%w: %s holds %s optimizer state, the run uses %s", ErrMismatch, file, got, st.Optimizer)
	}
	if steps, err := strconv.ParseInt(meta[MetaOptimizerSteps], 10, 64); err == nil {
		st.OptimizerSteps = max(st.OptimizerSteps, steps)
	}
	byName := make(map[string]checkpoint.Tensor, len(tensors))
	for _, t := range tensors {
		byName[t.Name] = t
	}
	for _, b := range plan.Shards[s].Blocks {
		v := plan.Vars[b.Var]
		name := blockName(v, b)
		lo, hi := b.RowStart*v.Cols, b.RowEnd*v.Cols
		if err := copyTensor(byName, name, st.Vars[b.Var][lo:hi], file); err != nil {
			return err
		}
		for k, slot := range slots {
			if err := copyTensor(byName, name+"/"+slot, st.Slots[k][b.Var][lo:hi], file); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyTensor(byName map[string]checkpoint.Tensor, name string, dst []float32, file string) error {
	t, ok := byName[name]
	if !ok {
		return fmt.Errorf("shardckpt: %s has no tensor %q (was it written for another model or shard count?)", file, name)
	}
	if len(t.Data) != len(dst) {
		return fmt.Errorf("shardckpt: %s tensor %q has %d values, want %d", file, name, len(t.Data), len(dst))
	}
	copy(dst, t.Data)
	return nil
}

// Shard returns shard s's flat parameters and optimizer state under plan
// (which may have a different number of shards than the checkpoint).
func (st State) Shard(plan partition.Plan, s int) (params, optState []float32) {
	size := plan.Shards[s].Size
	params = make([]float32, size)
	plan.Gather(s, st.Vars, params)
	if len(st.Slots) == 0 {
		return params, nil
	}
	optState = make([]float32, len(st.Slots)*size)
	for k, slot := range st.Slots {
		plan.Gather(s, slot, optState[k*size:(k+1)*size])
	}
	return params, optState
}

// shardFile is a checkpoint shard's file as ReadShard read it.
type shardFile struct {
	tensors []checkpoint.Tensor
	meta    map[string]string
	err     error
}

// readAll is fetch of shards 0 to n-1, on up to GOMAXPROCS goroutines.
func readAll(n int, fetch func(s int) shardFile) []shardFile {
	out := make([]shardFile, n)
	parallel.For(n, runtime.GOMAXPROCS(0), func(s int) { out[s] = fetch(s) })
	return out
}
