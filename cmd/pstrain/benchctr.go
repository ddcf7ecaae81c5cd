package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/optim"
	"github.com/pstrain/pstrain/tools/bench"
)

// parseSections reads --sections: a CTR model (--model ctr) is measured
// by the embeddings section alone, its default, and that section needs
// one.
func (c *benchCmd) parseSections() ([]string, error) {
	ctr := c.mr.Model.IsCTR()
	given := false
	c.fs.Visit(func(f *flag.Flag) { given = given || f.Name == "sections" })
	if ctr && !given {
		return []string{bench.SectionEmbeddings}, nil
	}
	secs, err := bench.ParseSections(c.sections)
	if err != nil {
		return nil, asUsage(err)
	}
	only := slices.Equal(secs, []string{bench.SectionEmbeddings})
	switch {
	case ctr && !only:
		return nil, usagef("--model ctr is measured by the embeddings section alone (--sections embeddings)")
	case !ctr && slices.Contains(secs, bench.SectionEmbeddings):
		return nil, usagef("--sections embeddings needs --model ctr")
	}
	return secs, nil
}

// benchSpec is the model the sections measure: MNIST's shape (their
// synthetic data have it), or a CTR model of Criteo's.
func (c *benchCmd) benchSpec() model.Spec {
	if c.mr.Model.IsCTR() {
		return c.mr.CTRSpec(ctrdata.Criteo.Dense, ctrdata.Criteo.Cat)
	}
	return c.mr.Spec(784, 10)
}

// embeddingsPlan is the embeddings section's plan for a CTR model (nil
// for another); runners sets its runner and directory.
func (c *benchCmd) embeddingsPlan(spec model.Spec) *bench.EmbeddingsPlan {
	if !spec.IsCTR() {
		return nil
	}
	p := bench.EmbeddingsPlanFor(c.quick)
	r := c.mr
	p.Spec, p.Rows, p.Batch, p.Seed, p.Cores, p.Now = spec, r.EmbeddingRule(), r.Batch, c.seed, runtime.NumCPU(), time.Now
	p.Dense = optim.Config{Name: r.Optimizer, LR: config.DefaultLR(r.Model, config.Sync, p.Workers), Momentum: r.Momentum}
	return &p
}

// ctrModelFlags are the flags every embeddings run is given: the model
// the bench was told.
func ctrModelFlags(r config.Run) []string {
	return []string{"--model=ctr", "--hidden=" + sizesText(&r.Hidden), fmt.Sprintf("--embedding-dim=%d", r.EmbeddingDim),
		"--embedding-optimizer=" + r.EmbeddingOptimizer, "--embedding-lr=" + strconv.FormatFloat(r.EmbeddingLR, 'g', -1, 64)}
}

// setEmbeddingsRunner points the embeddings plan (if any) at runner and
// a directory under dir for its data sets.
func (c *benchCmd) setEmbeddingsRunner(cfg *bench.Config, runner *bench.ExecRunner, dir string) {
	if cfg.Embeddings == nil {
		return
	}
	runner.Model = ctrModelFlags(c.mr)
	cfg.Embeddings.Runner, cfg.Embeddings.DataDir = runner, filepath.Join(dir, "ctr-data")
}
