package worker

import (
	"fmt"

	"context"
	"github.com/pstrain/pstrain/transport/rowclient"
	"math"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/ctr"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ps"
)

// recordingRows is embed.Local that records the versions and
// generation its calls came with.
type recordingRows struct {
	*embed.Local
	gen           int64
	pulls, pushes []int64
}

func (r *recordingRows) SetGeneration(g int64) { r.gen = g }

func (r *recordingRows) Pull(ctx context.Context, step int64, table string, keys []uint64, out []float32) error {
	r.pulls = append(r.pulls, step)
	return r.Local.Pull(ctx, step, table, keys, out)
}

func (r *recordingRows) Push(ctx context.Context, step int64, table string, keys []uint64, grads []float32) error {
	r.pushes = append(r.pushes, step)
	return r.Local.Push(ctx, step, table, keys, grads)
}

// ctrBatch is a batch of n samples whose keys use all 64 bits, some of
// them NaN bit patterns as float32 halves.
func ctrBatch(s ctrdata.Schema, n int) *ctrdata.Batch {
	b := ctrdata.NewBatch(s, n)
	b.N = n
	for i := range n {
		b.Labels[i] = uint8(i % 2)
		for d := range s.Dense {
			b.Dense[i*s.Dense+d] = float32(i+d) / 10
		}
		for f := range s.Cat {
			b.Keys[i*s.Cat+f] = uint64(i%3)<<60 | 0x7fc00001 | uint64(f)<<33
		}
	}
	return b
}

// A CTR worker's samples go through the batch source as float32 rows
// and come back intact (keys of 64 bits, NaN patterns too), and its
// step trains exactly as ctr.Net does on the batch itself: the same
// loss and dense gradients, its rows read and pushed at the lowest
// version of the views, in their newest generation.
func TestCTRNetStepsAsTheNetOnTheBatch(t *testing.T) {
	r := config.Default()
	r.Model, r.EmbeddingDim, r.Hidden = "ctr", 4, []int{8}
	s := ctrdata.Schema{Dense: 3, Cat: 2}
	spec := r.CTRSpec(s.Dense, s.Cat)
	const n = 6
	b := ctrBatch(s, n)
	tables := func() *embed.Local {
		var cfgs []embed.TableConfig
		for _, tb := range spec.Tables() {
			cfgs = append(cfgs, embed.TableConfig{Name: tb.Name, Dim: tb.Dim, Seed: 5, Rule: embed.DefaultAdagrad(0.5)})
		}
		l, err := embed.NewLocal(cfgs)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	want, err := ctr.New(spec, n, true)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := ctr.New(spec, n, true)
	if err != nil {
		t.Fatal(err)
	}
	for v, p := range spec.Init(1) {
		copy(want.Params()[v], p)
		copy(inner.Params()[v], p)
	}
	rows := &recordingRows{Local: tables()}
	net, err := NewCTRNet(inner, rows)
	if err != nil {
		t.Fatal(err)
	}
	// Through the batch source, as the worker fills its input.
	batches := dataset.NewBatcher(NewCTRSamples(b), n, 1)
	y := make([]uint8, n)
	batches.Next(net.Input(), y)
	net.SetLabels(y)
	views := []ps.PullView{{Version: 7, Generation: 2}, {Version: 5, Generation: 3}}
	got, err := net.StepFrom(context.Background(), context.Background(), views)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rows.pulls, []int64{5, 5}) || !slices.Equal(rows.pushes, []int64{5, 5}) || rows.gen != 3 {
		t.Errorf("rows pulled at %v, pushed at %v, generation %d; want version 5 (the lowest) and generation 3", rows.pulls, rows.pushes, rows.gen)
	}
	// The batcher shuffles: the reference steps on the samples in the
	// order the net decoded them.
	ref := ctrdata.NewBatch(s, n)
	ref.N = n
	for i := range n {
		copy(ref.Dense[i*s.Dense:(i+1)*s.Dense], net.b.Dense[i*s.Dense:(i+1)*s.Dense])
		copy(ref.Keys[i*s.Cat:(i+1)*s.Cat], net.b.Keys[i*s.Cat:(i+1)*s.Cat])
		ref.Labels[i] = y[i]
	}
	if !sameSamples(b, ref) {
		t.Fatalf("the samples decoded are not the batch's:\n%v\n%v", ref.Keys, b.Keys)
	}
	loss, err := want.Step(context.Background(), tables(), 5, ref)
	if err != nil {
		t.Fatal(err)
	}
	grads, _ := net.Grads()
	if got != loss || !equalGrads(grads, want.Grads()) {
		t.Errorf("CTRNet step: loss %v, the net's on the batch %v (or the dense gradients differ)", got, loss)
	}
}

// sameSamples says a and b hold the same samples, in any order.
func sameSamples(a, b *ctrdata.Batch) bool {
	key := func(x *ctrdata.Batch, i int) string {
		s := x.Schema
		out := []byte{x.Labels[i]}
		for _, v := range x.Dense[i*s.Dense : (i+1)*s.Dense] {
			out = append(out, byte(math.Float32bits(v)), byte(math.Float32bits(v)>>8), byte(math.Float32bits(v)>>16), byte(math.Float32bits(v)>>24))
		}
		for _, k := range x.Keys[i*s.Cat : (i+1)*s.Cat] {
			for sh := 0; sh < 64; sh += 8 {
				out = append(out, byte(k>>sh))
			}
		}
		return string(out)
	}
	var ka, kb []string
	for i := range a.N {
		ka, kb = append(ka, key(a, i)), append(kb, key(b, i))
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return a.N == b.N && slices.Equal(ka, kb)
}

func equalGrads(a, b [][]float32) bool {
	return slices.EqualFunc(a, b, func(x, y []float32) bool { return slices.Equal(x, y) })
}

// doneRows answers every call as a shard whose training is over.
type doneRows struct{}

func (doneRows) SetGeneration(int64) {}
func (doneRows) Pull(context.Context, int64, string, []uint64, []float32) error {
	return fmt.Errorf("shard 0: %w", rowclient.ErrDone)
}
func (doneRows) Push(context.Context, int64, string, []uint64, []float32) error {
	return fmt.Errorf("shard 0: %w", rowclient.ErrDone)
}

// A step whose rows find training over is no failure (the dense push
// then says so and the worker finishes); another error fails the step.
func TestCTRNetStepWhenTrainingIsOver(t *testing.T) {
	r := config.Default()
	r.Model, r.EmbeddingDim, r.Hidden = "ctr", 4, []int{8}
	spec := r.CTRSpec(3, 2)
	inner, err := ctr.New(spec, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	net, err := NewCTRNet(inner, doneRows{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.StepFrom(context.Background(), context.Background(), []ps.PullView{{Version: 3}}); err != nil {
		t.Errorf("a step after training ended: %v, want nil", err)
	}
	if _, err := net.StepFrom(context.Background(), context.Background(), nil); err == nil {
		t.Error("a step without views did not fail")
	}
}
