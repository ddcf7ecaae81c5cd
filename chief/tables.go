package chief

import (
	"context"
	"fmt"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	pb "github.com/pstrain/pstrain/proto"
	"github.com/pstrain/pstrain/ps"
	"github.com/pstrain/pstrain/transport/rowclient"
)

// TableConfigs are the embedding tables of run r's model spec (none for
// a model without): one per field of a CTR model, seeded by the run's
// seed and trained by its --embedding-optimizer.
func TableConfigs(r config.Run, spec model.Spec) []embed.TableConfig {
	tables := spec.Tables()
	if len(tables) == 0 {
		return nil
	}
	rule := r.EmbeddingRule()
	cfgs := make([]embed.TableConfig, len(tables))
	for i, t := range tables {
		cfgs[i] = embed.TableConfig{Name: t.Name, Dim: t.Dim, Seed: uint64(r.Seed), Rule: rule}
	}
	return cfgs
}

// tableSpecs is what an Init declares of the run's tables (nil: none),
// each with the run's --embedding-prefill.
func (c *Chief) tableSpecs() []*pb.TableSpec {
	cfgs := TableConfigs(c.cfg.Run, c.cfg.Spec)
	if cfgs == nil {
		return nil
	}
	specs := ps.TableSpecs(cfgs)
	for _, t := range specs {
		t.PrefillRows = c.cfg.Run.EmbeddingPrefill
	}
	return specs
}

// loadsRows says whether an Init from ck is followed by a load of its
// rows (rowsLoader; a PS change's initMoved): the shards then hold
// their row requests until the load is done.
func (c *Chief) loadsRows(ck *checkpoint.Checkpoint) bool {
	return ck != nil && len(c.cfg.Spec.Tables()) > 0
}

// rowsLoader is what loads shard s's rows of ck after its Init in
// generation gen (an Init installs empty tables; initShardThen): nil
// when ck has none to load. Each attempt reads the shard's rows anew, so
// the chief holds one shard's rows at a time.
func (c *Chief) rowsLoader(ck *checkpoint.Checkpoint, s int, gen int64) func(context.Context, pb.ParameterServerClient, *pb.InitResponse) error {
	if !c.loadsRows(ck) {
		return nil
	}
	return func(ctx context.Context, cl pb.ParameterServerClient, _ *pb.InitResponse) error {
		if err := rowclient.RestoreShard(ctx, ck, cl, s, len(c.cfg.PS), c.cfg.RunID, gen, 0); err != nil {
			return fmt.Errorf("chief: %w", err)
		}
		return nil
	}
}
