package embed

// index maps a table's keys to their slots. It is an open-addressing
// hash table with linear probing over a power-of-two array of buckets,
// each holding a slot plus one (0: empty), and no keys: a probe compares
// the key asked for with the key at the start of the slot's record, the
// record the caller reads next. A bucket is 4 bytes, so a key costs 8 to
// 16 bytes of index while the array grows (it is kept at most half
// full, so that a probe for a key not held, which reads the record of
// every bucket it passes, passes 2.5 on average), where a Go
// map[uint64]int32 took 39. The array never shrinks: after evictions a
// key costs more. Deletion shifts the entries after the deleted one back
// (no tombstones), so lookups never slow down with evictions. Growing
// rebuilds the whole array at once, in the call that adds the key that
// fills it: on a table of millions of rows that call takes a tenth of a
// second or more (a Go map grows a piece at a time).
type index struct {
	buckets []int32 // slot+1 of the key hashed here or probed on to; 0: empty
	n       int     // keys held
	shift   uint    // 64 - log2(len(buckets)): a hash's top bits are its home bucket
	seed    uint64  // mixed into every hash, so that keys cannot be chosen to collide
}

// minBuckets is an index's size at its first key: a table of a few rows
// (a field of ten values) takes little.
const minBuckets = 16

// hashKey spreads a key's bits, with seed, over all 64 (the finaliser
// of MurmurHash3): keys that differ in a few low bits, as sequential
// ones do, land far apart.
func hashKey(k, seed uint64) uint64 {
	k ^= seed
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// home is the bucket a key's probe starts at.
func (x *index) home(k uint64) int {
	return int(hashKey(k, x.seed) >> x.shift)
}

// find is the bucket holding k, or -1; recs is the table's records,
// whose first words hold their keys (recordKey).
func (x *index) find(k uint64, recs *column[float32]) int {
	if x.n == 0 {
		return -1
	}
	mask := len(x.buckets) - 1
	for i := x.home(k); ; i = (i + 1) & mask {
		b := x.buckets[i]
		if b == 0 {
			return -1
		}
		if recordKey(recs.at(b-1)) == k {
			return i
		}
	}
}

// get is k's slot.
func (x *index) get(k uint64, recs *column[float32]) (int32, bool) {
	i := x.find(k, recs)
	if i < 0 {
		return -1, false
	}
	return x.buckets[i] - 1, true
}

// put records slot as k's, k not being held. The array must have room
// (full says when it has none).
func (x *index) put(k uint64, slot int32) {
	x.place(k, slot)
	x.n++
}

// full says whether the array must grow before the next put.
func (x *index) full() bool { return (x.n+1)*2 > len(x.buckets) }

// maxKeys bounds reserve: a table's slots are int32.
const maxKeys = 1<<31 - 1

// grow doubles the array (resize).
func (x *index) grow(recs *column[float32], free []int32) {
	x.resize(max(minBuckets, 2*len(x.buckets)), recs, free)
}

// place writes slot into the first empty bucket of k's probe.
func (x *index) place(k uint64, slot int32) {
	mask := len(x.buckets) - 1
	i := x.home(k)
	for x.buckets[i] != 0 {
		i = (i + 1) & mask
	}
	x.buckets[i] = slot + 1
}

// reserve makes room for n keys in all, so that adding up to n grows the
// array at most once, now (resize).
func (x *index) reserve(n int, recs *column[float32], free []int32) {
	n = min(n, maxKeys)
	size := max(minBuckets, len(x.buckets))
	for n*2 > size {
		size *= 2
	}
	if size > len(x.buckets) {
		x.resize(size, recs, free)
	}
}

// resize puts the keys into a new array of size buckets (a power of
// two). Every slot of recs is held but those in free: they are read in
// slot order, one pass over the records the memory streams, where going
// by the old array would read them in a random order, a cache miss each.
func (x *index) resize(size int, recs *column[float32], free []int32) {
	x.buckets = make([]int32, size)
	x.shift = 64
	for s := size; s > 1; s >>= 1 {
		x.shift--
	}
	var gone []bool
	if len(free) > 0 {
		gone = make([]bool, recs.n)
		for _, s := range free {
			gone[s] = true
		}
	}
	for s := range int32(recs.n) {
		if gone == nil || !gone[s] {
			x.place(recordKey(recs.at(s)), s)
		}
	}
}

// remove drops k, if held, and says whether it was. The entries after it
// in its run of full buckets move back where their probes would look
// first, so no probe meets a hole before its key.
func (x *index) remove(k uint64, recs *column[float32]) bool {
	i := x.find(k, recs)
	if i < 0 {
		return false
	}
	mask := len(x.buckets) - 1
	for j := (i + 1) & mask; x.buckets[j] != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j]: its probe would not reach i.
		h := x.home(recordKey(recs.at(x.buckets[j] - 1)))
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			x.buckets[i] = x.buckets[j]
			i = j
		}
	}
	x.buckets[i] = 0
	x.n--
	return true
}

// each calls f with every slot held, in bucket order.
func (x *index) each(f func(slot int32)) {
	for _, b := range x.buckets {
		if b != 0 {
			f(b - 1)
		}
	}
}
