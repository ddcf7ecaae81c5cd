package chief

import (
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ps"
)

// A CTR run's Init declares one table per field, seeded by the run,
// trained by its embedding rule and pre-filled with its
// --embedding-prefill, as the PS reads them back; an MLP's declares
// none.
func TestInitDeclaresTheRunsTables(t *testing.T) {
	r := config.Default()
	r.Model, r.EmbeddingDim, r.EmbeddingOptimizer, r.EmbeddingLR, r.Seed = "ctr", 8, string(embed.Adagrad), 0.5, 42
	r.EmbeddingPrefill = 1234
	c := &Chief{cfg: Config{Run: r, Spec: r.CTRSpec(13, 3)}}
	specs := c.tableSpecs()
	got, err := ps.TableConfigs(specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range specs {
		if sp.PrefillRows != 1234 {
			t.Errorf("table %s declared with %d pre-filled rows, want --embedding-prefill's 1234", sp.Name, sp.PrefillRows)
		}
	}
	if len(got) != 3 {
		t.Fatalf("%d tables declared, want 3", len(got))
	}
	for i, tc := range got {
		want := embed.TableConfig{Name: c.cfg.Spec.Tables()[i].Name, Dim: 8, Seed: 42, Rule: r.EmbeddingRule()}
		if tc != want {
			t.Errorf("table %d declared as %+v, want %+v", i, tc, want)
		}
	}
	mlp := &Chief{cfg: Config{Run: config.Default(), Spec: config.Default().Spec(784, 10)}}
	if specs := mlp.tableSpecs(); specs != nil {
		t.Errorf("an MLP declares %d tables", len(specs))
	}
}

// A CTR run has no accuracy target: it trains its epochs whatever
// --target-accuracy says; other models keep theirs.
func TestCTRRunHasNoAccuracyTarget(t *testing.T) {
	r := config.Default()
	r.TargetAccuracy = 0.7
	if got := (CoreParams{Run: r, Spec: r.Spec(784, 10)}).target(); got != 0.7 {
		t.Errorf("an MLP's target %v, want 0.7", got)
	}
	r.Model, r.EmbeddingDim = "ctr", 8
	if got := (CoreParams{Run: r, Spec: r.CTRSpec(13, 26)}).target(); got != 0 {
		t.Errorf("a CTR model's target %v, want none (0)", got)
	}
}
