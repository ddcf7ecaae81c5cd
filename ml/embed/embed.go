package embed

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/pstrain/pstrain/internal/hashmix"
)

// fnv64 offsets and prime (FNV-1a).
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// tableHash names a table as a 64-bit word (FNV-1a of its name).
func tableHash(table string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(table); i++ {
		h ^= uint64(table[i])
		h *= fnvPrime
	}
	return h
}

// KeyHash is the placement hash of a table's key: a different table with
// the same key lands elsewhere.
func KeyHash(table string, key uint64) uint64 {
	return hashmix.Mix(tableHash(table) ^ hashmix.Mix(key))
}

// ShardOf is the shard, of n, that holds a table's row: the high word of
// KeyHash times n, so every shard gets an even share of the hash range.
func ShardOf(table string, key uint64, n int) int {
	return PlacerOf(table, n).Shard(key)
}

// Placer is ShardOf for one table's keys over n shards, the table's
// name hashed once.
type Placer struct {
	table uint64 // tableHash
	n     int
}

// PlacerOf is the Placer of table's keys over n shards.
func PlacerOf(table string, n int) Placer { return Placer{table: tableHash(table), n: n} }

// Shard is ShardOf(table, key, n).
func (p Placer) Shard(key uint64) int {
	if p.n <= 1 {
		return 0
	}
	hi, _ := bits.Mul64(hashmix.Mix(p.table^hashmix.Mix(key)), uint64(p.n))
	return int(hi)
}

// ShardsMeet says whether shard j of from shards and shard s of to
// shards can hold the same key of a table: ShardOf gives shard j of n
// the hash range [j/n, (j+1)/n) of the whole, so they can if their
// ranges overlap. When the count changes, a shard of the new count
// finds the rows it lacks only in the files of the old shards it meets.
func ShardsMeet(j, from, s, to int) bool {
	from, to = max(from, 1), max(to, 1)
	return j*to < (s+1)*from && s*from < (j+1)*to
}

// PrefillBase is the first key of the rows a table is pre-filled with
// (PrefillKey): 2^62. Data keys are below it: the synthetic set's keys
// are 32-bit words (ctrdata), as Criteo's hashed ids (8 hexadecimal
// digits) are, and a Criteo line's empty field is ctrdata.MissingKey,
// 2^64-1, above every key PrefillKey gives.
const PrefillBase uint64 = 1 << 62

// MaxPrefill bounds the rows a table is pre-filled with: the rows a
// table holds on one shard, which numbers them in 32 bits (a table of
// dimension 16 that size is far larger than this machine's memory).
const MaxPrefill int64 = 1<<31 - 1

// PrefillKey is the key of a table's i-th pre-filled row (0 <= i <
// MaxPrefill): a key no data set uses, so that training never touches
// the row. Pre-filled rows make tables as large as a test or a benchmark
// needs while the training stays that of the data.
func PrefillKey(i int64) uint64 { return PrefillBase + uint64(i) }

// InitRow writes the initial value of a row into out (len(out) is the
// table's dimension): uniform in [-1/sqrt(d), 1/sqrt(d)), drawn from a
// stream that depends only on the run's seed, the table and the key.
func InitRow(seed uint64, table string, key uint64, out []float32) {
	if len(out) == 0 {
		return
	}
	scale := 1 / math.Sqrt(float64(len(out)))
	state := hashmix.Mix(seed^hashmix.Golden) ^ KeyHash(table, key)
	for i := range out {
		state += hashmix.Golden
		u := float64(hashmix.Mix(state)>>11) / (1 << 53) // [0, 1)
		out[i] = float32((2*u - 1) * scale)
	}
}

// Deduper collapses a batch's keys to its unique keys, in the order they
// are first seen. It keeps its map between batches to spare allocations;
// it is not safe for concurrent use.
type Deduper struct {
	slot map[uint64]int32
}

// Dedup returns the unique keys of keys (appended to uniq[:0]) and, for
// each key, the index of its unique key (appended to index[:0]).
func (d *Deduper) Dedup(keys, uniq []uint64, index []int32) ([]uint64, []int32) {
	if d.slot == nil {
		d.slot = make(map[uint64]int32, len(keys))
	}
	clear(d.slot)
	uniq, index = uniq[:0], index[:0]
	for _, k := range keys {
		s, ok := d.slot[k]
		if !ok {
			s = int32(len(uniq))
			d.slot[k] = s
			uniq = append(uniq, k)
		}
		index = append(index, s)
	}
	return uniq, index
}

// Combine sums per-key gradients (len(index) rows of dim) into one
// gradient per unique key: out holds nUniq rows of dim and is overwritten.
// Summing is what a duplicate key means: the loss touched that row twice.
func Combine(index []int32, dim int, grads, out []float32) error {
	if len(grads) != len(index)*dim {
		return fmt.Errorf("embed: %d gradient values for %d keys of dimension %d", len(grads), len(index), dim)
	}
	clear(out)
	for i, s := range index {
		o := int(s) * dim
		if o+dim > len(out) {
			return fmt.Errorf("embed: key %d maps to row %d, beyond the %d rows given", i, s, len(out)/dim)
		}
		dst, src := out[o:o+dim], grads[i*dim:(i+1)*dim]
		for j := range dst {
			dst[j] += src[j]
		}
	}
	return nil
}

// Kind names a row update rule.
type Kind string

// The rules a table can train with.
const (
	SGD      Kind = "sgd"
	Momentum Kind = "momentum"
	Adagrad  Kind = "adagrad"
)

// Rule updates one row from its gradient. State is the row's optimizer
// state, StateLen(dim) values kept beside it and initialised by InitState.
type Rule struct {
	Kind     Kind
	LR       float32
	Momentum float32 // Momentum: the velocity's decay
	InitAcc  float32 // Adagrad: the accumulator's starting value (> 0)
	Eps      float32 // Adagrad: added to the root of the accumulator
}

// DefaultAdagrad is the rule most embedding tables train with: an initial
// accumulator of 0.1, as TensorFlow's Adagrad.
func DefaultAdagrad(lr float32) Rule {
	return Rule{Kind: Adagrad, LR: lr, InitAcc: 0.1, Eps: 1e-7}
}

// Validate says what is wrong with a rule.
func (r Rule) Validate() error {
	if !(r.LR > 0) || math.IsInf(float64(r.LR), 0) {
		return fmt.Errorf("embed: learning rate %v: want a positive finite number", r.LR)
	}
	switch r.Kind {
	case SGD:
	case Momentum:
		if !(r.Momentum >= 0 && r.Momentum < 1) {
			return fmt.Errorf("embed: momentum %v: want 0 <= m < 1", r.Momentum)
		}
	case Adagrad:
		if !(r.InitAcc > 0) || math.IsInf(float64(r.InitAcc), 0) {
			return fmt.Errorf("embed: adagrad initial accumulator %v: want > 0", r.InitAcc)
		}
		if !(r.Eps >= 0) || math.IsInf(float64(r.Eps), 0) {
			return fmt.Errorf("embed: adagrad epsilon %v: want >= 0", r.Eps)
		}
	default:
		return fmt.Errorf("embed: unknown rule %q (want sgd, momentum or adagrad)", r.Kind)
	}
	return nil
}

// StateLen is how many state values a row of dim keeps.
func (r Rule) StateLen(dim int) int {
	if r.Kind == SGD {
		return 0
	}
	return dim
}

// InitState writes a new row's optimizer state.
func (r Rule) InitState(state []float32) {
	v := float32(0)
	if r.Kind == Adagrad {
		v = r.InitAcc
	}
	for i := range state {
		state[i] = v
	}
}

// ErrShape is returned when a row, its state and its gradient disagree.
var ErrShape = errors.New("embed: row, state and gradient lengths disagree")

// Apply updates row (and its state) by grad.
func (r Rule) Apply(row, state, grad []float32) error {
	if len(grad) != len(row) || len(state) != r.StateLen(len(row)) {
		return ErrShape
	}
	switch r.Kind {
	case SGD:
		for i, g := range grad {
			row[i] -= r.LR * g
		}
	case Momentum:
		for i, g := range grad {
			state[i] = r.Momentum*state[i] + g
			row[i] -= r.LR * state[i]
		}
	case Adagrad:
		for i, g := range grad {
			state[i] += g * g
			row[i] -= r.LR * g / (float32(math.Sqrt(float64(state[i]))) + r.Eps)
		}
	default:
		return r.Validate()
	}
	return nil
}
