package main

import (
	"flag"
	"io"
	"reflect"
	"testing"

	"github.com/pstrain/pstrain/config"
)

func parseRunFlags(t *testing.T, args ...string) config.Run {
	t.Helper()
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	r := config.Default()
	m := bindRunFlags(fs, &r)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	m.defaultLR()
	return r
}

// --model cnn brings the CNN's default sizes for the flags not given, in
// whatever order they come; a child reads back a CNN configuration from
// runArgs.
func TestModelFlagsDefaultsAndRoundTrip(t *testing.T) {
	for _, c := range []struct {
		args         []string
		model        config.ModelKind
		conv, hidden []int
	}{
		{nil, "", nil, []int{800}},
		{[]string{"--model=cnn"}, "cnn", config.DefaultCNNConv, config.DefaultCNNHidden},
		{[]string{"--hidden=512", "--model=cnn"}, "cnn", config.DefaultCNNConv, []int{512}},
		{[]string{"--model=cnn", "--conv=32,64", "--hidden=512"}, "cnn", []int{32, 64}, []int{512}},
		{[]string{"--conv=8", "--model=cnn"}, "cnn", []int{8}, config.DefaultCNNHidden},
		{[]string{"--model=cnn", "--model=mlp"}, "", nil, []int{800}},
	} {
		r := parseRunFlags(t, c.args...)
		d := config.Default()
		lr, batch, warmup := d.LR, d.Batch, d.WarmupSteps
		if c.model.IsCNN() {
			lr, batch, warmup = config.DefaultCNNLR, config.DefaultCNNBatch, config.DefaultCNNWarmupSteps
		}
		if r.LR != lr || r.Batch != batch || r.WarmupSteps != warmup {
			t.Errorf("%v: lr %v batch %d warmup %d, want %v %d %d", c.args, r.LR, r.Batch, r.WarmupSteps, lr, batch, warmup)
		}
		if r.Model != c.model || !reflect.DeepEqual(r.Conv, c.conv) || !reflect.DeepEqual(r.Hidden, c.hidden) {
			t.Errorf("%v: model %q conv %v hidden %v, want %q %v %v", c.args, r.Model, r.Conv, r.Hidden, c.model, c.conv, c.hidden)
		}
		if err := r.Validate(); err != nil {
			t.Errorf("%v: %v", c.args, err)
		}
		if back := parseRunFlags(t, runArgs(r)...); !reflect.DeepEqual(back, r) {
			t.Errorf("%v: round trip through runArgs: %+v, want %+v", c.args, back, r)
		}
	}
	// A learning rate, batch or warmup given, before or after --model, stays.
	if r := parseRunFlags(t, "--lr=0.01", "--batch=32", "--model=cnn", "--warmup-steps=5"); r.LR != 0.01 || r.Batch != 32 || r.WarmupSteps != 5 {
		t.Errorf("given lr, batch and warmup replaced: %v %d %d", r.LR, r.Batch, r.WarmupSteps)
	}
	if r := parseRunFlags(t, "--model=cnn", "--batch=128", "--model=mlp"); r.Batch != 128 {
		t.Errorf("given batch replaced by a later --model: %d", r.Batch)
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	r := config.Default()
	bindRunFlags(fs, &r)
	if err := fs.Parse([]string{"--model=rnn"}); err == nil {
		t.Error("--model=rnn accepted")
	}
	if err := parseRunFlags(t, "--conv=16").Validate(); err == nil {
		t.Error("--conv without --model cnn accepted")
	}
}

// Without --lr the learning rate is config.DefaultLR's for the model,
// mode and workers, whatever order the flags come in; a given --lr stays.
func TestLRDefaultFollowsModeAndWorkers(t *testing.T) {
	for _, c := range []struct {
		args []string
		lr   float64
	}{
		{nil, 0.2},
		{[]string{"--mode=async"}, 0.1},
		{[]string{"--mode=ssp", "--workers=4"}, 0.05},
		{[]string{"--workers=4", "--mode=async"}, 0.05},
		{[]string{"--workers=4"}, 0.2},
		{[]string{"--model=cnn"}, 0.05},
		{[]string{"--mode=async", "--model=cnn"}, 0.025},
		{[]string{"--model=cnn", "--workers=4", "--mode=ssp"}, 0.0125},
		{[]string{"--model=cnn", "--mode=async", "--model=mlp"}, 0.1},
		{[]string{"--mode=async", "--mode=sync"}, 0.2},
		{[]string{"--lr=0.3", "--mode=async"}, 0.3},
		{[]string{"--mode=async", "--lr=0.3", "--workers=4"}, 0.3},
	} {
		r := parseRunFlags(t, c.args...)
		if r.LR != c.lr {
			t.Errorf("%v: lr %v, want %v", c.args, r.LR, c.lr)
		}
		if back := parseRunFlags(t, runArgs(r)...); back.LR != r.LR {
			t.Errorf("%v: round trip through runArgs: lr %v, want %v", c.args, back.LR, r.LR)
		}
	}
}

// --model ctr brings the CTR model's defaults (sizes, embeddings, the
// synthetic data set, the learning rate) for the flags not given, in any
// order; another model after it takes them back; a child reads the
// configuration back from runArgs.
func TestModelFlagsCTR(t *testing.T) {
	for _, c := range []struct {
		args    []string
		dim     int
		dataset string
		hidden  []int
		elr     float64
	}{
		{[]string{"--model=ctr"}, config.DefaultEmbeddingDim, "synth-ctr", config.DefaultCTRHidden, config.DefaultEmbeddingLR},
		{[]string{"--embedding-dim=8", "--dataset=criteo:day0.txt", "--model=ctr"}, 8, "criteo:day0.txt", config.DefaultCTRHidden, config.DefaultEmbeddingLR},
		{[]string{"--model=ctr", "--hidden=32", "--embedding-lr=0.5"}, config.DefaultEmbeddingDim, "synth-ctr", []int{32}, 0.5},
		{[]string{"--model=ctr", "--embedding-prefill=240385"}, config.DefaultEmbeddingDim, "synth-ctr", config.DefaultCTRHidden, config.DefaultEmbeddingLR},
	} {
		r := parseRunFlags(t, c.args...)
		if r.Model != "ctr" || r.EmbeddingDim != c.dim || r.Dataset != c.dataset || !reflect.DeepEqual(r.Hidden, c.hidden) ||
			r.EmbeddingLR != c.elr || r.EmbeddingOptimizer != "adagrad" || r.LR != config.DefaultCTRLR {
			t.Errorf("%v: %+v", c.args, r)
		}
		if err := r.Validate(); err != nil {
			t.Errorf("%v: %v", c.args, err)
		}
		if back := parseRunFlags(t, runArgs(r)...); !reflect.DeepEqual(back, r) {
			t.Errorf("%v: round trip through runArgs: %+v, want %+v", c.args, back, r)
		}
	}
	if r := parseRunFlags(t, runArgs(parseRunFlags(t, "--model=ctr", "--embedding-prefill=77"))...); r.EmbeddingPrefill != 77 {
		t.Errorf("--embedding-prefill 77 through runArgs: %d", r.EmbeddingPrefill)
	}
	// --patience: the CTR model's default unless given, in any order.
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 0},
		{[]string{"--model=ctr"}, config.DefaultCTRPatience},
		{[]string{"--patience=5", "--model=ctr"}, 5},
		{[]string{"--model=ctr", "--patience=0"}, 0},
		{[]string{"--model=cnn", "--patience=2"}, 2},
	} {
		if r := parseRunFlags(t, c.args...); r.Patience != c.want {
			t.Errorf("%v: patience %d, want %d", c.args, r.Patience, c.want)
		} else if back := parseRunFlags(t, runArgs(r)...); back.Patience != c.want {
			t.Errorf("%v: patience %d through runArgs, want %d", c.args, back.Patience, c.want)
		}
	}
	if err := parseRunFlags(t, "--patience=-1").Validate(); err == nil {
		t.Error("--patience -1 accepted")
	}
	r := parseRunFlags(t, "--model=ctr", "--model=mlp")
	d := config.Default()
	if r.EmbeddingDim != 0 || r.EmbeddingOptimizer != "" || r.EmbeddingLR != 0 || r.Patience != 0 || r.Dataset != d.Dataset || !reflect.DeepEqual(r.Hidden, d.Hidden) {
		t.Errorf("--model ctr then mlp: %+v", r)
	}
	if err := r.Validate(); err != nil {
		t.Error(err)
	}
}
