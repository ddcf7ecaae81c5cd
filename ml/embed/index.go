package embed

import "math"

// index maps a table's keys to their slots. A key's hash picks one of
// indexParts parts (its top bits), and each part is an open-addressing
// hash table with linear probing over a power-of-two array of buckets,
// each holding a slot plus one (0: empty), and no keys: a probe compares
// the key asked for with the key at the start of the slot's record, the
// record the caller reads next. A bucket is 4 bytes, so a key costs 8 to
// 16 bytes of index while the arrays grow (each is kept at most half
// full, so that a probe for a key not held, which reads the record of
// every bucket it passes, passes 2.5 on average), where a Go
// map[uint64]int32 took 39. The arrays never shrink: after evictions a
// key costs more. Deletion shifts the entries after the deleted one back
// (no tombstones), so lookups never slow down with evictions. A part
// grows on its own, when a key would fill it, and rebuilding it reads
// the records of its keys alone: a key added rebuilds at most about
// 1/indexParts of the table's keys (in one array, a table of millions of
// rows stalled its call for a tenth of a second or more). The parts fill
// alike, so a call that adds many keys near a doubling (a batch's, a
// load's) may grow several. An empty index is 2.5 KiB, and a part holds
// at least 8 buckets once used.
type index struct {
	parts [indexParts]part
	n     int    // keys held
	seed  uint64 // mixed into every hash, so that keys cannot be chosen to collide
	sink  uint32 // getMany's reads of its records' last lines, kept so that they are made
}

// part is one of an index's hash tables.
type part struct {
	buckets []int32 // slot+1 of the key hashed here or probed on to; 0: empty
	n       int     // keys held
	shift   uint    // 64 - log2(len(buckets)): the hash's bits after the part's are its home bucket
}

const (
	// partBits of a hash choose its part.
	partBits   = 6
	indexParts = 1 << partBits
	// minBuckets is a part's size at its first key: a table of a few
	// rows (a field of ten values) takes little.
	minBuckets = 8
)

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

// locate is k's part and the hash bits that place it within the part.
func (x *index) locate(k uint64) (*part, uint64) {
	h := hashKey(k, x.seed)
	return &x.parts[h>>(64-partBits)], h << partBits
}

// home is the bucket of the part a key's probe starts at, h being the
// key's hash bits after the part's (locate).
func (p *part) home(h uint64) int { return int(h >> p.shift) }

// find is the bucket of p holding k, or -1; recs is the table's
// records, whose first words hold their keys (recordKey).
func (p *part) find(k, h uint64, recs *column[float32]) int {
	if p.n == 0 {
		return -1
	}
	mask := len(p.buckets) - 1
	for i := p.home(h); ; i = (i + 1) & mask {
		b := p.buckets[i]
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
	p, h := x.locate(k)
	i := p.find(k, h, recs)
	if i < 0 {
		return -1, false
	}
	return p.buckets[i] - 1, true
}

// getMany is get of every key, into out (-1: not held). Its first pass
// reads each key's home bucket and its second the record that bucket
// names, each pass a loop of loads independent of one another, so that
// the processor overlaps their cache misses (on tables far larger than
// the caches each is one, and get's two are one after the other); a key
// whose home bucket names another key's record is probed on as get does.
func (x *index) getMany(keys []uint64, recs *column[float32], out []int32) {
	for i, k := range keys {
		p, h := x.locate(k)
		if len(p.buckets) == 0 {
			out[i] = 0
			continue
		}
		out[i] = p.buckets[p.home(h)]
	}
	var sink uint32
	for i, k := range keys {
		b := out[i]
		if b == 0 {
			out[i] = -1
			continue
		}
		rec := recs.at(b - 1)
		switch {
		case recordKey(rec) == k:
			out[i] = b - 1
			sink ^= math.Float32bits(rec[len(rec)/2]) ^ math.Float32bits(rec[len(rec)-1])
		default:
			s, ok := x.get(k, recs)
			if !ok {
				s = -1
			}
			out[i] = s
		}
	}
	x.sink ^= sink
}

// put records slot as k's, k not being held (its record already holds
// k), growing k's part first if it is half full.
func (x *index) put(k uint64, slot int32, recs *column[float32]) {
	p, h := x.locate(k)
	if (p.n+1)*2 > len(p.buckets) {
		x.grow(p, recs)
	}
	p.place(h, slot)
	p.n++
	x.n++
}

// place writes slot into the first empty bucket of the probe of hash
// bits h.
func (p *part) place(h uint64, slot int32) {
	mask := len(p.buckets) - 1
	i := p.home(h)
	for p.buckets[i] != 0 {
		i = (i + 1) & mask
	}
	p.buckets[i] = slot + 1
}

// grow moves p's keys into an array twice the size.
func (x *index) grow(p *part, recs *column[float32]) {
	x.growTo(p, max(minBuckets, 2*len(p.buckets)), recs)
}

// growTo moves p's keys into an array of size buckets (a power of two),
// reading each key from its record.
func (x *index) growTo(p *part, size int, recs *column[float32]) {
	old := p.buckets
	p.buckets = make([]int32, size)
	p.shift = 64
	for s := size; s > 1; s >>= 1 {
		p.shift--
	}
	for _, b := range old {
		if b != 0 {
			_, h := x.locate(recordKey(recs.at(b - 1)))
			p.place(h, b-1)
		}
	}
}

// reserve makes room for n keys in all: every part smaller than its
// share of n (plus an eighth, as the parts fill alike but not evenly)
// needs at half full is rebuilt once at that size, where adding the
// keys one by one would rebuild it at every doubling on the way. Parts
// that large already are left alone.
func (x *index) reserve(n int, recs *column[float32]) {
	share := n/indexParts + n/(8*indexParts) + 1
	size := minBuckets
	for size < 2*share {
		size *= 2
	}
	for i := range x.parts {
		if p := &x.parts[i]; len(p.buckets) < size {
			x.growTo(p, size, recs)
		}
	}
}

// remove drops k, if held, and says whether it was. The entries after it
// in its run of full buckets move back where their probes would look
// first, so no probe meets a hole before its key.
func (x *index) remove(k uint64, recs *column[float32]) bool {
	p, h := x.locate(k)
	i := p.find(k, h, recs)
	if i < 0 {
		return false
	}
	mask := len(p.buckets) - 1
	for j := (i + 1) & mask; p.buckets[j] != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j]: its probe would not reach i.
		_, hj := x.locate(recordKey(recs.at(p.buckets[j] - 1)))
		hm := p.home(hj)
		if (j > i && (hm <= i || hm > j)) || (j < i && hm <= i && hm > j) {
			p.buckets[i] = p.buckets[j]
			i = j
		}
	}
	p.buckets[i] = 0
	p.n--
	x.n--
	return true
}

// each calls f with every slot held, part by part in bucket order.
func (x *index) each(f func(slot int32)) {
	for i := range x.parts {
		for _, b := range x.parts[i].buckets {
			if b != 0 {
				f(b - 1)
			}
		}
	}
}
