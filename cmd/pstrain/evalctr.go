package main

import (
	"context"
	"fmt"
	"io"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/ctr"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
)

// evalCTR scores a CTR checkpoint on its data set's test set: the dense
// weights and every row it holds (a key it holds no row of reads its
// seeded initial row, as on the shards), as the chief's evaluation
// scores the model.
func evalCTR(ctx context.Context, ck *checkpoint.Checkpoint, r config.Run, spec model.Spec, stdout io.Writer) error {
	set, err := ctrdata.Open(r.DataDir, r.Dataset)
	if err != nil {
		return err
	}
	defer set.Close()
	if s := set.Test.Schema(); s.Dense != spec.Input || s.Cat != spec.Fields {
		return fmt.Errorf("the checkpoint's model %s does not fit %s (%d dense and %d categorical fields)", spec, r.Dataset, s.Dense, s.Cat)
	}
	st, err := shardckpt.Read(ck, spec, r.Optimizer)
	if err != nil {
		return err
	}
	tables, err := checkpointTables(ck, chief.TableConfigs(r, spec))
	if err != nil {
		return err
	}
	net, err := ctr.New(spec, min(1000, set.Test.Len()), false)
	if err != nil {
		return err
	}
	for v, dst := range net.Params() {
		copy(dst, st.Vars[v])
	}
	sc, err := ctr.Evaluate(ctx, net, ctr.PeekRows{P: tables}, set.Test)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "checkpoint %s (step %d, version %d, model %s)\n", ck.Path, ck.Manifest.Step, ck.Manifest.Version, spec)
	fmt.Fprintf(stdout, "test auc %.4f  logloss %.4f  normalized entropy %.4f  on %d %s test samples\n",
		sc.AUC, sc.LogLoss, sc.NormalizedEntropy, set.Test.Len(), r.Dataset)
	if set.Meta != nil {
		fmt.Fprintf(stdout, "planted model's auc %.4f\n", set.Meta.PlantedAUC)
	}
	return nil
}

// tablePeeker reads rows of tables without creating any (ctr.Peeker).
type tablePeeker map[string]*embed.Table

// Peek implements ctr.Peeker.
func (p tablePeeker) Peek(table string, keys []uint64, out []float32) error {
	t, ok := p[table]
	if !ok {
		return fmt.Errorf("no table %q", table)
	}
	return t.Peek(keys, out)
}

// checkpointTables are the tables of cfgs holding the checkpoint's rows.
func checkpointTables(ck *checkpoint.Checkpoint, cfgs []embed.TableConfig) (tablePeeker, error) {
	p := tablePeeker{}
	for _, c := range cfgs {
		t, err := embed.NewTable(c)
		if err != nil {
			return nil, err
		}
		p[c.Name] = t
	}
	rows, err := shardckpt.ReadTables(ck, func(string, uint64) bool { return true })
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		t, ok := p[r.Name]
		if !ok {
			return nil, fmt.Errorf("%s: rows of %s, a table the model does not have", ck.Path, r.Name)
		}
		cfg := t.Config()
		d, sl := cfg.Dim, cfg.Rule.StateLen(cfg.Dim)
		if err := r.Check(d, sl); err != nil {
			return nil, fmt.Errorf("%s: %w", ck.Path, err)
		}
		for i, k := range r.Keys {
			if err := t.Put(k, 0, r.Values[i*d:(i+1)*d], r.State[i*sl:(i+1)*sl]); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}
