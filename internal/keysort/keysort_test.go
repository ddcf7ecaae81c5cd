package keysort

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

type pair struct {
	key uint64
	at  int32
}

// Pairs gives what a stable comparison sort gives, for keys of every
// width (bytes shared by all keys are skipped) and lengths on both sides
// of the insertion sort's.
func TestPairsIsAStableSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, smallSort - 1, smallSort, smallSort + 1, 1000, 100_000} {
		for _, mask := range []uint64{0xff, 0xffff_ffff, ^uint64(0), 0xff00_0000_0000_00ff, 3} {
			keys, at := make([]uint64, n), make([]int32, n)
			want := make([]pair, n)
			for i := range n {
				keys[i], at[i] = r.Uint64()&mask, int32(i)
				want[i] = pair{keys[i], at[i]}
			}
			slices.SortStableFunc(want, func(a, b pair) int { return cmp.Compare(a.key, b.key) })
			Pairs(keys, at)
			for i := range n {
				if keys[i] != want[i].key || at[i] != want[i].at {
					t.Fatalf("n %d mask %#x: position %d is (%d, %d), want (%d, %d)", n, mask, i, keys[i], at[i], want[i].key, want[i].at)
				}
			}
		}
	}
}

func TestPairsRefusesUnequalLengths(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for 2 keys and 1 slot")
		}
	}()
	Pairs([]uint64{2, 1}, []int32{0})
}

// The keys of a table of 10^8/2/16/26 rows (a shard's of the 10^8
// parameters' tables), ids below 10^7: radix against the comparison
// sort it replaces.
// (64bit: keys of 64 random bits, every pass made.)
func BenchmarkPairs(b *testing.B) {
	const n = 120_000
	r := rand.New(rand.NewPCG(1, 2))
	ids, wide := make([]uint64, n), make([]uint64, n)
	for i := range ids {
		ids[i], wide[i] = r.Uint64N(10_000_000), r.Uint64()
	}
	keys, at := make([]uint64, n), make([]int32, n)
	for _, c := range []struct {
		name string
		src  []uint64
	}{{"", ids}, {"64bit/", wide}} {
		b.Run(c.name+"radix", func(b *testing.B) {
			for range b.N {
				copy(keys, c.src)
				Pairs(keys, at)
			}
		})
		b.Run(c.name+"comparison", func(b *testing.B) {
			ps := make([]pair, n)
			for range b.N {
				for i, k := range c.src {
					ps[i] = pair{k, int32(i)}
				}
				slices.SortFunc(ps, func(a, b pair) int { return cmp.Compare(a.key, b.key) })
			}
		})
	}
}
