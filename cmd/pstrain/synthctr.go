package main

import (
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/pstrain/pstrain/ml/ctrdata"
)

// cmdSynthCTR is `pstrain data synth-ctr`: it writes the synthetic
// click-through-rate set and prints what its planted model scores.
func cmdSynthCTR(args []string, stdout io.Writer) error {
	c := ctrdata.DefaultConfig()
	fs := newFlagSet("data synth-ctr", "data synth-ctr [flags]",
		"Write a seeded Criteo-shaped click-through-rate data set (13 dense and 26 categorical fields,\n"+
			"vocabularies of 10 to 10^7 keys, Zipf-distributed keys, labels drawn from a planted model)\n"+
			"and print the planted model's test AUC: the best a model can reach (docs/models.md).")
	out := fs.String("out", filepath.Join("data", ctrdata.SynthName), "directory to write train.ctr, test.ctr and meta.json into (--dataset synth-ctr reads DATA-DIR/"+ctrdata.SynthName+")")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of the planted model and the samples (the same seed writes the same bytes)")
	fs.IntVar(&c.Train, "train", c.Train, "training samples")
	fs.IntVar(&c.Test, "test", c.Test, "test samples")
	fs.Float64Var(&c.Zipf, "zipf", c.Zipf, "exponent of the keys' Zipf distribution (above 1)")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := c.Validate(); err != nil {
		return &usageError{cmd: fs.Name(), err: err}
	}
	start := time.Now()
	m, err := ctrdata.Generate(*out, c)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %d training and %d test samples into %s in %.1fs\n", c.Train, c.Test, *out, time.Since(start).Seconds())
	fmt.Fprintf(stdout, "base rate %.4f (train) %.4f (test)\n", m.TrainBaseRate, m.TestBaseRate)
	fmt.Fprintf(stdout, "planted model on the test set: auc %.4f logloss %.4f normalized_entropy %.4f\n", m.PlantedAUC, m.PlantedLogLoss, m.PlantedNE)
	return nil
}
