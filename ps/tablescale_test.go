package ps

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
)

// The embedding tables' scale goal (docs/models.md, "The bench"): a step
// costs what it touches, not what the tables hold. BenchmarkTableStep
// runs one shard's (of two) sync steps of the same keys on tables that
// hold 10^6 and 10^8 parameters in total over the two shards: 26 tables
// of dimension 16 under Adagrad, as the CTR model's. Every step touches
// the same rows in both: the small tables' keys, which the large tables
// hold scattered among their other rows (inserted in a random order), so
// the large tables pay their key indexes' and blocks' cache misses.

const (
	scaleTables = 26
	scaleDim    = 16
	// scaleWorkers push a step's gradients; each looks up scaleBatch
	// samples' keys, one per table.
	scaleWorkers = 2
	scaleBatch   = 128
	// scaleSteps are the distinct steps drawn; the benchmark cycles them.
	scaleSteps = 32
	// scaleZipf is the key distribution's exponent (the synthetic set's
	// default).
	scaleZipf = 1.1
)

func scaleConfigs() []embed.TableConfig {
	cfgs := make([]embed.TableConfig, scaleTables)
	for i := range cfgs {
		cfgs[i] = embed.TableConfig{Name: fmt.Sprintf("emb/C%d", i+1), Dim: scaleDim, Seed: 1, Rule: embed.DefaultAdagrad(0.05)}
	}
	return cfgs
}

// shardKeys is the first n keys of table that shard 0 of 2 holds.
func shardKeys(table string, n int) []uint64 {
	out := make([]uint64, 0, n)
	for k := uint64(0); len(out) < n; k++ {
		if embed.ShardOf(table, k, 2) == 0 {
			out = append(out, k)
		}
	}
	return out
}

// fillTables creates rows of every table on ts: the keys of keys, in
// a random order.
func fillTables(b *testing.B, ts *TableSet, keys map[string][]uint64, rng *rand.Rand) {
	b.Helper()
	const chunk = 8192
	out := make([]float32, chunk*scaleDim)
	for name, all := range keys {
		order := rng.Perm(len(all))
		batch := make([]uint64, 0, chunk)
		for i, j := range order {
			batch = append(batch, all[j])
			if len(batch) == chunk || i == len(order)-1 {
				if err := ts.Pull(name, batch, out[:len(batch)*scaleDim]); err != nil {
					b.Fatal(err)
				}
				batch = batch[:0]
			}
		}
	}
}

// scaleStep is one sync step's row requests to the shard: each
// worker's pull of its unique keys, and its push of their gradients (in
// the same order, as a worker's rowclient sends them).
type scaleStep struct {
	pulls  [][]RowBlock
	pushes [][]RowBlock
}

// drawSteps draws steps whose keys follow a Zipf law over touched (each
// table's keys that a step may touch), deduplicated per worker and
// table as a worker's are.
func drawSteps(touched map[string][]uint64, rng *rand.Rand) []scaleStep {
	steps := make([]scaleStep, scaleSteps)
	for i := range steps {
		st := &steps[i]
		st.pulls, st.pushes = make([][]RowBlock, scaleWorkers), make([][]RowBlock, scaleWorkers)
		for name, keys := range touched {
			z := rand.NewZipf(rng, scaleZipf, 1, uint64(len(keys)-1))
			for w := range scaleWorkers {
				mine := map[uint64]bool{}
				// The shard sees about half of a batch's lookups.
				for range scaleBatch / 2 {
					mine[keys[z.Uint64()]] = true
				}
				blk := RowBlock{Table: name}
				for k := range mine {
					blk.Keys = append(blk.Keys, k)
				}
				blk.Values = make([]float32, len(blk.Keys)*scaleDim)
				for j := range blk.Values {
					blk.Values[j] = float32(rng.NormFloat64()) * 1e-3
				}
				st.pushes[w] = append(st.pushes[w], blk)
				st.pulls[w] = append(st.pulls[w], RowBlock{Table: name, Keys: blk.Keys, Values: make([]float32, len(blk.Values))})
			}
		}
	}
	return steps
}

func BenchmarkTableStep(b *testing.B) {
	// Rows per table on this shard for 10^6 and 10^8 parameters over 2.
	small := 1_000_000 / 2 / scaleDim / scaleTables
	for _, total := range []int{1_000_000, 100_000_000} {
		rows := total / 2 / scaleDim / scaleTables
		b.Run(fmt.Sprintf("parameters=%.0e", float64(total)), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			ts, err := NewTableSet(scaleConfigs(), config.Sync, 0, 2, 0)
			if err != nil {
				b.Fatal(err)
			}
			all, touched := map[string][]uint64{}, map[string][]uint64{}
			for _, c := range scaleConfigs() {
				all[c.Name] = shardKeys(c.Name, rows)
				touched[c.Name] = all[c.Name][:small]
			}
			fillTables(b, ts, all, rng)
			steps := drawSteps(touched, rand.New(rand.NewPCG(3, 4)))
			var held int
			for _, s := range ts.TableStats() {
				held += s.Rows
			}
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			var keys int
			for _, pulls := range steps[0].pulls {
				for _, p := range pulls {
					keys += len(p.Keys)
				}
			}
			cpu0 := processCPU(b)
			b.ResetTimer()
			for i := range b.N {
				scaleStepOnce(b, ts, steps[i%len(steps)])
			}
			b.StopTimer()
			// The CPU a step took, which a loaded machine moves much less
			// than the wall time ns/op is.
			b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(held*scaleDim), "params/shard")
			b.ReportMetric(float64(keys), "pulled-keys/step")
			b.ReportMetric(float64(ms.HeapInuse)/float64(held*scaleDim*8), "heap/state")
		})
	}
}

// scaleStepOnce is one sync step: each worker's keys pulled, its
// gradients staged, the step applied.
func scaleStepOnce(b *testing.B, ts *TableSet, st scaleStep) {
	for w, blocks := range st.pulls {
		if err := ts.PullBlocks(w, blocks); err != nil {
			b.Fatal(err)
		}
	}
	v := ts.Version()
	for w, blocks := range st.pushes {
		if _, err := ts.PushBlocks(w, v, blocks); err != nil {
			b.Fatal(err)
		}
	}
	if err := ts.Advance(v+1, []int{0, 1}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTableLoad loads one shard's (of two) rows of tables holding
// 10^8 parameters in all into a new table set, as a restore or a shard
// that rows move to does: the work a PS does while a CTR run's layout
// change pauses its training.
func BenchmarkTableLoad(b *testing.B) {
	rows := 100_000_000 / 2 / scaleDim / scaleTables
	src, err := NewTableSet(scaleConfigs(), config.Sync, 0, 2, 0)
	if err != nil {
		b.Fatal(err)
	}
	all := map[string][]uint64{}
	for _, c := range scaleConfigs() {
		all[c.Name] = shardKeys(c.Name, rows)
	}
	fillTables(b, src, all, rand.New(rand.NewPCG(1, 2)))
	snap := src.Snapshot()
	src = nil
	b.ResetTimer()
	for range b.N {
		ts, err := NewTableSet(scaleConfigs(), config.Sync, 0, 2, 0)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range snap {
			if err := ts.Load(r); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(rows*scaleTables), "rows/op")
}
