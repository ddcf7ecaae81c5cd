package embed

import (
	"cmp"
	"math"
)

// index maps a table's keys to their slots. A key's hash picks one of
// indexParts parts (its top bits), and each part is an open-addressing
// hash table with linear probing over a power-of-two array of buckets,
// each holding a slot plus one (0: empty) and a 7-bit tag of its key's
// hash, and no keys: a probe compares the key asked for with the key at
// the start of the slot's record, the record the caller reads next, for
// the buckets whose tag is the key's. A bucket is 4 bytes, so a key
// costs 8 to 16 bytes of index while the arrays grow (each is kept at
// most half full, so that a probe for a key not held passes 2.5 buckets
// on average), where a Go map[uint64]int32 took 39. The arrays never shrink: after evictions a
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
	// untagged: a slot reached tagLimit, and buckets hold slots alone.
	untagged bool
	tagLimit int32 // the first slot stored untagged (0: untaggedFrom)
}

// A bucket holds its slot plus one in its low slotBits bits and, while
// every slot fits there, 7 bits of its key's hash above them (its tag):
// a probe reads the record of a bucket only when the tag is the key's,
// which spares the cache miss of most records it passes. Once a table
// holds a slot of untaggedFrom or more (16.7 million rows on one shard),
// its buckets lose their tags.
const (
	slotBits     = 24
	slotMask     = 1<<slotBits - 1
	tagMask      = 0x7f
	untaggedFrom = slotMask // the first slot whose slot+1 does not fit in slotBits
)

// tagging is what a bucket holding a key of hash bits h (locate's)
// holds above its slot (want) and the bits that hold it (mask), both 0
// once untagged.
func (x *index) tagging(h uint64) (want, mask int32) {
	if x.untagged {
		return 0, 0
	}
	return int32((h>>partBits)&tagMask) << slotBits, ^int32(slotMask)
}

// slotOf is the slot a bucket holds.
func (x *index) slotOf(b int32) int32 {
	if x.untagged {
		return b - 1
	}
	return b&slotMask - 1
}

// part is one of an index's hash tables.
type part struct {
	buckets []int32 // the bucket (slot+1 and tag) of the key hashed here or probed on to; 0: empty
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
// records, whose first words hold their keys (recordKey); want and mask
// are k's tagging.
func (p *part) find(k, h uint64, recs *column[float32], want, mask int32) int {
	if p.n == 0 {
		return -1
	}
	wrap := len(p.buckets) - 1
	for i := p.home(h); ; i = (i + 1) & wrap {
		b := p.buckets[i]
		if b == 0 {
			return -1
		}
		if b&mask == want && recordKey(recs.at(b&^mask-1)) == k {
			return i
		}
	}
}

// get is k's slot.
func (x *index) get(k uint64, recs *column[float32]) (int32, bool) {
	p, h := x.locate(k)
	want, mask := x.tagging(h)
	i := p.find(k, h, recs, want, mask)
	if i < 0 {
		return -1, false
	}
	return p.buckets[i]&^mask - 1, true
}

// getMany is get of every key, into out (-1: not held). Its first pass
// reads each key's home bucket and its second the record that bucket
// names, if the bucket's tag is the key's, each pass a loop of loads
// independent of one another, so that the processor overlaps their
// cache misses (on tables far larger than the caches each is one, and
// get's two are one after the other); a key whose home bucket names
// another key is probed on as get does. The second pass also reads its
// records' middle and last words, so that the rows' work finds every
// line of the record in the cache.
func (x *index) getMany(keys []uint64, recs *column[float32], out []int32) {
	// out[i] after the first pass: the slot the home bucket names, plus
	// one; 0: the bucket is empty; -1: it names another key (its tag).
	for i, k := range keys {
		p, h := x.locate(k)
		if len(p.buckets) == 0 {
			out[i] = 0
			continue
		}
		want, mask := x.tagging(h)
		switch b := p.buckets[p.home(h)]; {
		case b == 0 || b&mask == want:
			out[i] = b &^ mask
		default:
			out[i] = -1
		}
	}
	var sink uint32
	for i, k := range keys {
		b := out[i]
		if b == 0 {
			out[i] = -1
			continue
		}
		var rec []float32
		if b > 0 {
			rec = recs.at(b - 1)
		}
		switch {
		case rec != nil && recordKey(rec) == k:
			out[i] = b - 1
			sink ^= touch(rec)
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

// touch reads a record's middle and last words, so that the lines
// after its first are in the cache when its row is worked on; the
// caller keeps the result (index.sink) so that the reads are made.
func touch(rec []float32) uint32 {
	return math.Float32bits(rec[len(rec)/2]) ^ math.Float32bits(rec[len(rec)-1])
}

// put records slot as k's, k not being held (its record already holds
// k), growing k's part first if it is half full.
func (x *index) put(k uint64, slot int32, recs *column[float32]) {
	if limit := cmp.Or(x.tagLimit, untaggedFrom); !x.untagged && slot >= limit {
		x.untag()
	}
	p, h := x.locate(k)
	if (p.n+1)*2 > len(p.buckets) {
		x.grow(p, recs)
	}
	p.place(h, x.bucket(slot, h))
	p.n++
	x.n++
}

// bucket is what a bucket holding slot, of a key of hash bits h, holds.
func (x *index) bucket(slot int32, h uint64) int32 {
	want, _ := x.tagging(h)
	return slot + 1 | want
}

// place writes bucket b into the first empty bucket of the probe of hash
// bits h.
func (p *part) place(h uint64, b int32) {
	wrap := len(p.buckets) - 1
	i := p.home(h)
	for p.buckets[i] != 0 {
		i = (i + 1) & wrap
	}
	p.buckets[i] = b
}

// untag drops every bucket's tag: a slot no longer fits beside one.
// A bucket's place does not depend on its tag, so the probes stay as
// they were.
func (x *index) untag() {
	for i := range x.parts {
		for j, b := range x.parts[i].buckets {
			x.parts[i].buckets[j] = b & slotMask
		}
	}
	x.untagged = true
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
			s := x.slotOf(b)
			_, h := x.locate(recordKey(recs.at(s)))
			p.place(h, x.bucket(s, h))
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
	want, mask := x.tagging(h)
	i := p.find(k, h, recs, want, mask)
	if i < 0 {
		return false
	}
	wrap := len(p.buckets) - 1
	for j := (i + 1) & wrap; p.buckets[j] != 0; j = (j + 1) & wrap {
		// The entry at j may fill the hole at i unless its home lies
		// cyclically in (i, j]: its probe would not reach i.
		_, hj := x.locate(recordKey(recs.at(x.slotOf(p.buckets[j]))))
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
				f(x.slotOf(b))
			}
		}
	}
}
