package embed

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// onePart is n keys that an index of seed 0 puts in its first part.
func onePart(n int) []uint64 {
	var keys []uint64
	for k := uint64(0); len(keys) < n; k++ {
		if hashKey(k<<20, 0)>>(64-partBits) == 0 {
			keys = append(keys, k<<20) // keys apart in high bits only
		}
	}
	return keys
}

// insert gives k a slot as Table.place does (a freed one, or a new one),
// writes k into its record and indexes it.
func insert(x *index, recs *column[float32], free *[]int32, k uint64) int32 {
	var s int32
	if n := len(*free); n > 0 {
		s, *free = (*free)[n-1], (*free)[:n-1]
	} else {
		s = recs.add()
	}
	putKey(recs.mut(s), k)
	x.put(k, s, recs)
	return s
}

// TestIndexAgreesWithAMap runs random puts, removes and gets on an index
// and on a map side by side, with keys all of one part (and, last, of
// any part). Few keys in a small array make long runs of full buckets
// that wrap around its end, which is where backward-shift deletion goes
// wrong if it does.
func TestIndexAgreesWithAMap(t *testing.T) {
	anyPart := make([]uint64, 1000)
	for i := range anyPart {
		anyPart[i] = uint64(i) << 20
	}
	for _, c := range []struct {
		keys  []uint64
		limit int32 // tagLimit: a slot this large rebuilds the index untagged
	}{{onePart(12), 0}, {onePart(40), 0}, {onePart(1000), 0}, {anyPart, 0}, {onePart(1000), 300}, {anyPart, 300}} {
		keys := c.keys
		space := uint64(len(keys))
		rng := rand.New(rand.NewPCG(space, uint64(7+c.limit)))
		x := index{tagLimit: c.limit}
		recs := newColumn[float32](keyWords)
		want := map[uint64]int32{}
		var free []int32
		for op := range 20000 {
			k := keys[rng.IntN(len(keys))]
			s, held := want[k]
			switch got, ok := x.get(k, &recs); {
			case ok != held || ok && got != s:
				t.Fatalf("space %d op %d: get(%d) = %d, %v; want %d, %v", space, op, k, got, ok, s, held)
			case held && rng.IntN(2) == 0:
				if !x.remove(k, &recs) {
					t.Fatalf("space %d op %d: remove(%d) of a held key said no", space, op, k)
				}
				delete(want, k)
				free = append(free, s)
			case !held:
				want[k] = insert(&x, &recs, &free, k)
			}
			if x.n != len(want) {
				t.Fatalf("space %d op %d: %d keys held, want %d", space, op, x.n, len(want))
			}
			if op%100 == 0 {
				checkGetMany(t, &x, &recs, keys, want)
			}
		}
		var slots []int32
		x.each(func(s int32) { slots = append(slots, s) })
		var wantSlots []int32
		for _, s := range want {
			wantSlots = append(wantSlots, s)
		}
		slices.Sort(slots)
		slices.Sort(wantSlots)
		if !slices.Equal(slots, wantSlots) {
			t.Fatalf("space %d: each gave %d slots, want %d", space, len(slots), len(wantSlots))
		}
		if x.remove(1<<62, &recs) {
			t.Fatalf("space %d: removed a key never held", space)
		}
		if want := c.limit > 0; x.untagged != want {
			t.Fatalf("space %d, tag limit %d: untagged %t, want %t", space, c.limit, x.untagged, want)
		}
	}
}

// checkGetMany: getMany of keys (held or not, from an empty index on)
// gives each its slot in want, -1 for a key not held.
func checkGetMany(t *testing.T, x *index, recs *column[float32], keys []uint64, want map[uint64]int32) {
	t.Helper()
	got := make([]int32, len(keys))
	x.getMany(keys, recs, got)
	for i, k := range keys {
		s, held := want[k]
		if !held {
			s = -1
		}
		if got[i] != s {
			t.Fatalf("getMany: key %d at slot %d, want %d", k, got[i], s)
		}
	}
}

// sparseRecords is a column of n records whose blocks are made only
// where a key is written (setKey): slots near 2^24 cost one block.
func sparseRecords(n int) column[float32] {
	c := newColumn[float32](keyWords)
	c.blocks, c.shared, c.n = make([][]float32, n/blockRows+1), make([]bool, n/blockRows+1), n
	return c
}

func setKey(c *column[float32], s int32, k uint64) {
	if b := int(s) / blockRows; c.blocks[b] == nil {
		c.blocks[b] = make([]float32, blockRows*keyWords)
	}
	putKey(c.mut(s), k)
}

// TestIndexAtTheTagLimit: slots up to untaggedFrom-1 are held tagged
// (keys of every tag among them), a freed low slot reused beside them
// keeps the index tagged, the slot untaggedFrom drops the tags first,
// and slots past 24 bits are held after that; every stage answers get,
// getMany and each as a map does, through a reserve and removals.
func TestIndexAtTheTagLimit(t *testing.T) {
	recs := sparseRecords(1<<24 + 4096)
	x := index{seed: 12345}
	want := map[uint64]int32{}
	k := uint64(0)
	add := func(s int32) {
		k++
		setKey(&recs, s, k)
		x.put(k, s, &recs)
		want[k] = s
	}
	check := func(stage string) {
		t.Helper()
		keys := []uint64{1 << 60, 1<<61 + 3} // (not held)
		for k := range want {
			keys = append(keys, k)
		}
		checkGetMany(t, &x, &recs, keys, want)
		for _, k := range keys {
			s, held := want[k]
			if got, ok := x.get(k, &recs); ok != held || held && got != s {
				t.Fatalf("%s: get(%d) = %d, %t; want %d, %t", stage, k, got, ok, s, held)
			}
		}
		n := 0
		x.each(func(s int32) {
			if want[recordKey(recs.at(s))] != s {
				t.Fatalf("%s: each gave slot %d, not its key's", stage, s)
			}
			n++
		})
		if n != len(want) {
			t.Fatalf("%s: each gave %d slots, want %d", stage, n, len(want))
		}
	}
	tags := map[uint64]bool{}
	for s := int32(0); len(tags) < tagMask+1 || s < 2000; s++ {
		add(s)
		tags[hashKey(k, x.seed)&tagMask] = true
	}
	for _, s := range []int32{untaggedFrom - 3, untaggedFrom - 2, untaggedFrom - 1} {
		add(s)
	}
	if x.untagged {
		t.Fatalf("untagged before slot %d", untaggedFrom)
	}
	check("tagged, slots up to the limit")
	for k, s := range want {
		if s < 100 {
			x.remove(k, &recs)
			delete(want, k)
		}
	}
	add(5)
	if x.untagged {
		t.Fatal("a freed low slot reused untagged the index")
	}
	check("tagged, after removals and a slot reused")
	add(untaggedFrom)
	if !x.untagged {
		t.Fatalf("slot %d held tagged", untaggedFrom)
	}
	check("untagged")
	add(untaggedFrom + 1)
	add(1<<24 + 100)
	x.reserve(4*len(want), &recs)
	check("untagged, slots past 24 bits, after a reserve")
	rng := rand.New(rand.NewPCG(1, 2))
	for k := range want {
		if rng.IntN(2) == 0 {
			x.remove(k, &recs)
			delete(want, k)
		}
	}
	check("untagged, after removals")
}

// TestIndexKeepsItsLoadBounded: every part grows before it is half
// full, and the keys spread over the parts, so that a part's growth
// rebuilds a small share of them.
func TestIndexKeepsItsLoadBounded(t *testing.T) {
	var x index
	recs := newColumn[float32](keyWords)
	const n = 100_000
	for i := range uint64(n) {
		s := recs.add()
		putKey(recs.mut(s), i)
		x.put(i, s, &recs)
	}
	buckets, most := 0, 0
	for i := range x.parts {
		p := &x.parts[i]
		if p.n*2 > len(p.buckets) {
			t.Fatalf("part %d: %d keys in %d buckets", i, p.n, len(p.buckets))
		}
		buckets, most = buckets+len(p.buckets), max(most, p.n)
	}
	if x.n != n || buckets > 4*n || most > 2*n/indexParts {
		t.Fatalf("%d keys: %d buckets in all, %d in the fullest part", x.n, buckets, most)
	}
	for i := range uint64(n) {
		if s, ok := x.get(i, &recs); !ok || recordKey(recs.at(s)) != i {
			t.Fatalf("key %d: slot %d, %v", i, s, ok)
		}
	}
}

// A key's bits survive the float32 words of its record, whatever they
// spell as floats (signalling NaNs, infinities, denormals), through a
// freeze and the copy the next write makes.
func TestRecordKeysKeepTheirBits(t *testing.T) {
	keys := []uint64{0, 1, 0x7f800001_7fa00000, 0xffc00001_ff800000, 0x00000001_80000000, ^uint64(0)}
	recs := newColumn[float32](keyWords + 1)
	for _, k := range keys {
		putKey(recs.mut(recs.add()), k)
	}
	frozen := recs.freeze()
	for i, k := range keys {
		recs.mut(int32(i))[keyWords] = 1 // copies the shared block
		if got, fz := recordKey(recs.at(int32(i))), recordKey(frozen.at(i)); got != k || fz != k {
			t.Fatalf("key %#x read back as %#x, frozen %#x", k, got, fz)
		}
	}
}

// Growing a part puts back the slots it holds, not slots freed since,
// whose records still hold the keys removed.
func TestIndexGrowsOverTheSlotsHeld(t *testing.T) {
	var x index
	recs := newColumn[float32](keyWords)
	var free []int32
	for k := range uint64(4000) {
		s := insert(&x, &recs, &free, k)
		if k%3 == 0 { // a third removed as they come: the parts grow with slots freed
			if !x.remove(k, &recs) {
				t.Fatalf("key %d not held", k)
			}
			free = append(free, s)
		}
	}
	var held []int32
	x.each(func(s int32) { held = append(held, s) })
	if x.n != 2666 || len(held) != 2666 {
		t.Fatalf("%d keys held and %d slots listed, want 2666", x.n, len(held))
	}
	for k := range uint64(4000) {
		if _, ok := x.get(k, &recs); ok != (k%3 != 0) {
			t.Fatalf("key %d held: %v", k, ok)
		}
	}
}

// BenchmarkTableGrowth fills a table (dimension 16, Adagrad) to 6.3
// million rows, a row a Pull, and reports the longest Pull: the one that
// grew the index most, which a shard's step would wait for. Run it with
// -benchtime 1x (an op is the whole fill).
func BenchmarkTableGrowth(b *testing.B) {
	const rows = 6_300_000
	out := make([]float32, 16)
	var worst time.Duration
	for range b.N {
		tb, err := NewTable(TableConfig{Name: "emb/C1", Dim: 16, Seed: 1, Rule: DefaultAdagrad(0.1)})
		if err != nil {
			b.Fatal(err)
		}
		for i := range uint64(rows) {
			t0 := time.Now()
			if err := tb.Pull(1, []uint64{i * 0x9e3779b97f4a7c15}, out); err != nil {
				b.Fatal(err)
			}
			worst = max(worst, time.Since(t0))
		}
	}
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-pull-ms")
}
