package rowclient

import (
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/ml/embed"
)

// shares is each shard's share of the row requests that batches of Zipf
// keys (exponent s, vocabulary vocab) make of a table: every lookup
// (dedup false), or each batch's unique keys (the client's requests).
func shares(table string, s float64, vocab uint64, shards, batch, batches int, dedup bool, seed int64) []float64 {
	z := rand.NewZipf(rand.New(rand.NewSource(seed)), s, 1, vocab-1)
	count := make([]float64, shards)
	keys := make([]uint64, batch)
	var d embed.Deduper
	var uniq []uint64
	var index []int32
	for range batches {
		for i := range keys {
			keys[i] = z.Uint64()
		}
		req := keys
		if dedup {
			uniq, index = d.Dedup(keys, uniq, index)
			req = uniq
		}
		for _, k := range req {
			count[embed.ShardOf(table, k, shards)]++
		}
	}
	return normalise(count)
}

func normalise(count []float64) []float64 {
	var sum float64
	for _, c := range count {
		sum += c
	}
	for i := range count {
		count[i] /= sum
	}
	return count
}

// peak is the largest share over the mean share.
func peak(sh []float64) float64 {
	m := 0.0
	for _, x := range sh {
		m = math.Max(m, x)
	}
	return m * float64(len(sh))
}

func fmtShares(sh []float64) string {
	parts := make([]string, len(sh))
	for i, x := range sh {
		parts[i] = fmt.Sprintf("%.3f", x)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// With Zipf keys (exponent 1.1) a hot key is one row, on one shard: the
// lookups of one table load its shard well beyond the mean share, and
// no hash placement can split one row. The worker's dedup sends a hot key
// once per batch, so the requests the shards serve follow the batch's
// unique keys, mostly the tail's, which the hash spreads evenly: no shard
// serves more than 1.25x the mean share, for 2-4 shards and vocabularies
// up to 10^7, one table or 26 Criteo-shaped ones. (Run with -v for the
// figures.)
func TestZipfRowRequestsBalanceAfterDedup(t *testing.T) {
	const s, batch, batches, names = 1.1, 512, 60, 8
	for _, vocab := range []uint64{1e4, 1e5, 1e6, 1e7} {
		for shards := 2; shards <= 4; shards++ {
			// Which shard the hot keys land on depends on the table's
			// name: the worst of several tables.
			var worstRaw, worstDedup []float64
			for n := range names {
				table := fmt.Sprintf("emb/C%d", n+1)
				raw := shares(table, s, vocab, shards, batch, batches, false, 1)
				dd := shares(table, s, vocab, shards, batch, batches, true, 1)
				if worstRaw == nil || peak(raw) > peak(worstRaw) {
					worstRaw = raw
				}
				if worstDedup == nil || peak(dd) > peak(worstDedup) {
					worstDedup = dd
				}
			}
			t.Logf("one table, vocab %.0e, %d shards, worst of %d tables: lookups %s (peak %.2fx mean), after dedup %s (peak %.2fx)",
				float64(vocab), shards, names, fmtShares(worstRaw), peak(worstRaw), fmtShares(worstDedup), peak(worstDedup))
			if peak(worstDedup) > 1.25 {
				t.Errorf("vocab %d, %d shards: after dedup a shard serves %.2fx the mean share", vocab, shards, peak(worstDedup))
			}
		}
	}
	// 26 tables, vocabularies log-spaced from 10 to 10^7 (the synthetic
	// Criteo shape): each table's hot keys hash to their own shards.
	const batches26 = 200
	for shards := 2; shards <= 4; shards++ {
		raw, dd := make([]float64, shards), make([]float64, shards)
		for f := range 26 {
			vocab := uint64(math.Round(math.Pow(10, 1+6*float64(f)/25)))
			name := fmt.Sprintf("emb/C%d", f+1)
			r := shares(name, s, vocab, shards, batch, batches26, false, int64(f))
			d := shares(name, s, vocab, shards, batch, batches26, true, int64(f))
			u := uniquePerBatch(s, vocab, batch, int64(f))
			for i := range raw {
				raw[i] += r[i] * batch
				dd[i] += d[i] * u
			}
		}
		raw, dd = normalise(raw), normalise(dd)
		t.Logf("26 tables, %d shards: lookups %s (peak %.2fx), after dedup %s (peak %.2fx)", shards, fmtShares(raw), peak(raw), fmtShares(dd), peak(dd))
		if peak(dd) > 1.25 {
			t.Errorf("26 tables, %d shards: after dedup a shard serves %.2fx the mean share", shards, peak(dd))
		}
	}
}

// uniquePerBatch is the mean number of unique keys of a batch.
func uniquePerBatch(s float64, vocab uint64, batch int, seed int64) float64 {
	z := rand.NewZipf(rand.New(rand.NewSource(seed)), s, 1, vocab-1)
	var d embed.Deduper
	total := 0
	keys := make([]uint64, batch)
	for range 20 {
		for i := range keys {
			keys[i] = z.Uint64()
		}
		u, _ := d.Dedup(keys, nil, nil)
		total += len(u)
	}
	return float64(total) / 20
}
