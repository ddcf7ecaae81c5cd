package ps

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/ctrdata"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/observe/metrics"
	pb "github.com/pstrain/pstrain/proto"
)

// Pre-filled keys lie above every key a data set gives: the 32-bit keys
// of the synthetic set and of Criteo's hashed ids, and below Criteo's
// empty field.
func TestPrefillKeysAreNoDataKeys(t *testing.T) {
	if lo := embed.PrefillKey(0); lo <= math.MaxUint32 {
		t.Errorf("the first pre-filled key %d is a 32-bit data key", lo)
	}
	if hi := embed.PrefillKey(embed.MaxPrefill - 1); hi >= ctrdata.MissingKey || hi < embed.PrefillKey(0) {
		t.Errorf("the last pre-filled key %d wraps or reaches the missing-field key %d", hi, uint64(ctrdata.MissingKey))
	}
}

// Each shard pre-fills the keys embed.ShardOf gives it: over the shards,
// every one of the n keys once, each row as a first touch makes it (the
// seeded initial row, the rule's first state), counted as admitted; a
// second pre-fill creates nothing.
func TestPrefillSpreadsTheKeysOverTheShards(t *testing.T) {
	const shards, n = 3, 1000
	cfgs := tableCfgs(3, 0) // admission would wait for 3 sightings: a pre-fill does not
	sets := newTableSets(t, cfgs, config.Sync, shards)
	for _, c := range cfgs {
		var all []uint64
		for s, ts := range sets {
			made, err := ts.Prefill(context.Background(), c.Name, n)
			if err != nil {
				t.Fatal(err)
			}
			tab := ts.Table(c.Name)
			if made != tab.Len() || made == 0 || int64(made) != ts.TableStats()[c.Name].Admissions {
				t.Fatalf("shard %d table %s: made %d rows, holds %d, admitted %d", s, c.Name, made, tab.Len(), ts.TableStats()[c.Name].Admissions)
			}
			for _, k := range tab.Keys() {
				if got := embed.ShardOf(c.Name, k, shards); got != s {
					t.Fatalf("table %s key %d on shard %d, ShardOf says %d", c.Name, k, s, got)
				}
				checkFirstRow(t, c, tab, k)
			}
			all = append(all, tab.Keys()...)
			if again, err := ts.Prefill(context.Background(), c.Name, n); err != nil || again != 0 {
				t.Fatalf("a second pre-fill made %d rows (%v), want 0", again, err)
			}
		}
		slices.Sort(all)
		if len(all) != n || all[0] != embed.PrefillKey(0) || all[n-1] != embed.PrefillKey(n-1) {
			t.Fatalf("table %s: %d keys over the shards from %d to %d, want the %d from %d", c.Name, len(all), all[0], all[len(all)-1], n, embed.PrefillKey(0))
		}
	}
	if _, err := sets[0].Prefill(context.Background(), "emb/C1", -1); err == nil {
		t.Error("a negative pre-fill was accepted")
	}
	if _, err := sets[0].Prefill(context.Background(), "emb/C1", embed.MaxPrefill+1); err == nil {
		t.Error("a pre-fill past MaxPrefill was accepted")
	}
	// An Init given up on (its context ended) stops pre-filling within a
	// chunk rather than building the tables to the end.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	made, err := sets[1].Prefill(ctx, "emb/C2", 10*prefillChunk)
	if !errors.Is(err, context.Canceled) || made >= 10*prefillChunk/2 {
		t.Errorf("pre-fill under an ended context: %d rows made, err %v; want it stopped with context.Canceled", made, err)
	}
}

// checkFirstRow checks that key's row of tab is the one a first touch
// makes.
func checkFirstRow(t *testing.T, c embed.TableConfig, tab *embed.Table, k uint64) {
	t.Helper()
	row, state, ok := tab.Row(k)
	want := make([]float32, c.Dim)
	embed.InitRow(c.Seed, c.Name, k, want)
	wantState := make([]float32, c.Rule.StateLen(c.Dim))
	c.Rule.InitState(wantState)
	if !ok || !slices.Equal(row, want) || !slices.Equal(state, wantState) {
		t.Fatalf("table %s key %d: row %v state %v, want %v and %v", c.Name, k, row, state, want, wantState)
	}
}

// Sync steps over pre-filled tables train the data's rows exactly as
// over empty ones (bit for bit: the same sums in the same order), and
// leave the pre-filled rows as they were made.
func TestTrainingOverPrefilledTablesIsTrainingWithout(t *testing.T) {
	const workers, shards, perWorker, steps, n = 2, 2, 40, 5, 500
	cfgs := tableCfgs(0, 0)
	plain := newTableSets(t, cfgs, config.Sync, shards)
	filled := newTableSets(t, cfgs, config.Sync, shards)
	for _, ts := range filled {
		for _, c := range cfgs {
			if _, err := ts.Prefill(context.Background(), c.Name, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for step := range int64(steps) {
		for _, c := range cfgs {
			for w := range workers {
				keys, grads := uniqueGrads(t, randomBatch(rng, perWorker, c.Dim, 30), c.Dim, 1)
				pullPushShards(t, plain, c, w, step, keys, grads)
				pullPushShards(t, filled, c, w, step, keys, grads)
			}
		}
		for s := range shards {
			for _, ts := range []*TableSet{plain[s], filled[s]} {
				if err := ts.Advance(step+1, []int{0, 1}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for s := range shards {
		for _, c := range cfgs {
			p, f := plain[s].Table(c.Name), filled[s].Table(c.Name)
			for _, k := range p.Keys() {
				pr, ps, _ := p.Row(k)
				fr, fs, ok := f.Row(k)
				if !ok || !slices.Equal(pr, fr) || !slices.Equal(ps, fs) {
					t.Fatalf("shard %d table %s key %d: %v %v with the pre-fill, %v %v without", s, c.Name, k, fr, fs, pr, ps)
				}
			}
			for _, k := range f.Keys() {
				if k >= embed.PrefillBase {
					checkFirstRow(t, c, f, k)
				}
			}
			if f.Len() <= p.Len() {
				t.Fatalf("shard %d table %s: %d rows with the pre-fill, %d without", s, c.Name, f.Len(), p.Len())
			}
		}
	}
}

// An Init pre-fills its tables unless it loads a checkpoint's rows, and
// the shard's table metrics count the pre-filled rows and their bytes.
func TestInitPrefillsUnlessLoadingAndCountsTheRows(t *testing.T) {
	cfgs := tableCfgs(0, 0)
	specs := TableSpecs(cfgs)
	for _, sp := range specs {
		sp.PrefillRows = 300
	}
	req := &pb.InitRequest{Shard: 1, NumShards: 2, Tables: specs}
	ts, err := buildTables(context.Background(), req, config.Sync)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.NewTables(nil)
	h := newTableHost(m)
	h.install(ts, "r", 1, false, false, false, 0)
	for _, c := range cfgs {
		tab := ts.Table(c.Name)
		if tab.Len() == 0 || tab.Len() == 300 {
			t.Errorf("table %s: shard 1 of 2 holds %d of 300 pre-filled rows", c.Name, tab.Len())
		}
		if got := testutil.ToFloat64(m.Rows.WithLabelValues(c.Name)); got != float64(tab.Len()) {
			t.Errorf("table %s: rows gauge %v, holds %d", c.Name, got, tab.Len())
		}
		if got := testutil.ToFloat64(m.Bytes.WithLabelValues(c.Name)); got != float64(tab.Bytes()) || got == 0 {
			t.Errorf("table %s: bytes gauge %v, holds %d", c.Name, got, tab.Bytes())
		}
	}
	req.RowsLoading = true
	if ts, err = buildTables(context.Background(), req, config.Sync); err != nil {
		t.Fatal(err)
	}
	for _, c := range cfgs {
		if n := ts.Table(c.Name).Len(); n != 0 {
			t.Errorf("table %s: an Init loading rows pre-filled %d", c.Name, n)
		}
	}
	req.RowsLoading, req.Tables[0].PrefillRows = false, -1
	if _, err := buildTables(context.Background(), req, config.Sync); err == nil {
		t.Error("an Init pre-filling -1 rows was accepted")
	}
}
