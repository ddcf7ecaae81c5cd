package main

import (
	"encoding/json"
	"flag"
	"io"
	"reflect"
	"testing"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
)

// runArgs renders every run flag, the schedule's included, so a child
// process reads back the configuration it was started with.
func TestRunArgsRoundTripSchedule(t *testing.T) {
	r := config.Default()
	r.LRSchedule, r.WarmupSteps = "step:2:0.5", 100
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	back := config.Default()
	bindRunFlags(fs, &back)
	if err := fs.Parse(runArgs(r)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, back) {
		t.Fatalf("round trip: %+v\nwant %+v", back, r)
	}
	for _, args := range [][]string{{"--lr-schedule=step:x:0.5"}, {"--warmup-steps=-3"}} {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c := config.Default()
		bindRunFlags(fs, &c)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestOptimizerLine(t *testing.T) {
	run := config.Default()
	run.LRSchedule, run.WarmupSteps = "cosine", 50
	for _, c := range []struct {
		m    checkpoint.Manifest
		want string
	}{
		{checkpoint.Manifest{Optimizer: checkpoint.Optimizer{Name: "momentum", Hyperparams: map[string]float64{"lr": 0.05, "momentum": 0.9},
			Schedule: "cosine"}}, "momentum lr 0.05 momentum 0.9 schedule cosine warmup 0"},
		{checkpoint.Manifest{Optimizer: checkpoint.Optimizer{Name: "adam", Hyperparams: map[string]float64{"lr": 0.001, "beta1": 0.9, "beta2": 0.999},
			Schedule: "step:1:0.5", WarmupSteps: 100}}, "adam lr 0.001 beta1 0.9 beta2 0.999 schedule step:1:0.5 warmup 100"},
		// Written before manifests recorded the schedule: from the run
		// configuration, or constant.
		{checkpoint.Manifest{Optimizer: checkpoint.Optimizer{Name: "sgd", Hyperparams: map[string]float64{"lr": 0.2}}, RunConfig: run.JSON()},
			"sgd lr 0.2 schedule cosine warmup 50"},
		{checkpoint.Manifest{Optimizer: checkpoint.Optimizer{Name: "sgd"}, RunConfig: json.RawMessage(`{"lr":0.2}`)},
			"sgd schedule constant warmup 0"},
		{checkpoint.Manifest{Optimizer: checkpoint.Optimizer{Name: "sgd"}}, "sgd schedule constant warmup 0"},
	} {
		if got := optimizerLine(c.m); got != c.want {
			t.Errorf("optimizerLine = %q, want %q", got, c.want)
		}
	}
}

func TestLRText(t *testing.T) {
	r := config.Default()
	r.LRSchedule = "constant"
	if got := lrText(r); got != "0.2" {
		t.Errorf("constant: %q", got)
	}
	r.LRSchedule, r.WarmupSteps = "step:2:0.3", 50
	if got := lrText(r); got != "0.2 (step:2:0.3, warmup 50)" {
		t.Errorf("scheduled: %q", got)
	}
	r.LRSchedule = "constant"
	if got := lrText(r); got != "0.2 (warmup 50)" {
		t.Errorf("warmup only: %q", got)
	}
}
