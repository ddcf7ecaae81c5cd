package ctrdata

import (
	"fmt"
	"io"
)

// Schema is a data set's fields: Dense numeric values and Cat categorical
// keys per sample.
type Schema struct {
	Dense int `json:"dense"`
	Cat   int `json:"cat"`
}

// Criteo is the shape of Criteo's logs: 13 dense and 26 categorical
// fields.
var Criteo = Schema{Dense: 13, Cat: 26}

// Validate says what is wrong with a schema.
func (s Schema) Validate() error {
	if s.Dense < 0 || s.Cat < 0 || s.Dense+s.Cat == 0 || s.Dense > 1<<16 || s.Cat > 1<<16 {
		return fmt.Errorf("ctrdata: %d dense and %d categorical fields: want some, and at most 65536 of each", s.Dense, s.Cat)
	}
	return nil
}

// FieldName names categorical field f (from 0) as Criteo does: C1, C2,
// ... The embedding table of field f is "emb/" + FieldName(f).
func FieldName(f int) string { return fmt.Sprintf("C%d", f+1) }

// Batch is up to Cap() samples, stored sample after sample: sample i's
// label is Labels[i], its dense values Dense[i*s.Dense:(i+1)*s.Dense],
// its keys Keys[i*s.Cat:(i+1)*s.Cat]. N samples are valid.
type Batch struct {
	Schema Schema
	N      int
	Labels []uint8
	Dense  []float32
	Keys   []uint64
}

// NewBatch returns an empty batch of room for size samples.
func NewBatch(s Schema, size int) *Batch {
	return &Batch{
		Schema: s,
		Labels: make([]uint8, size),
		Dense:  make([]float32, size*s.Dense),
		Keys:   make([]uint64, size*s.Cat),
	}
}

// Cap is how many samples the batch can hold.
func (b *Batch) Cap() int { return len(b.Labels) }

// Key is sample i's key of categorical field f.
func (b *Batch) Key(i, f int) uint64 { return b.Keys[i*b.Schema.Cat+f] }

// Source is a data set split (training or test) whose samples are
// numbered from 0 to Len()-1.
type Source interface {
	Schema() Schema
	Len() int
	// Open streams samples [lo, hi) in order.
	Open(lo, hi int) (Stream, error)
}

// Stream reads samples in order.
type Stream interface {
	// Next fills b with up to b.Cap() next samples and sets b.N; at the
	// end of the range it returns io.EOF with b.N 0.
	Next(b *Batch) error
	Close() error
}

// ReadAll reads every sample of src into one batch (tests and small
// evaluation sets).
func ReadAll(src Source) (*Batch, error) {
	n := src.Len()
	all := NewBatch(src.Schema(), n)
	st, err := src.Open(0, n)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	chunk := NewBatch(src.Schema(), min(max(n, 1), 4096))
	for {
		err := st.Next(chunk)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		all.appendFrom(chunk)
	}
	if all.N != n {
		return nil, fmt.Errorf("ctrdata: read %d samples of %d", all.N, n)
	}
	return all, nil
}

// appendFrom copies c's samples after b's.
func (b *Batch) appendFrom(c *Batch) {
	s := b.Schema
	copy(b.Labels[b.N:], c.Labels[:c.N])
	copy(b.Dense[b.N*s.Dense:], c.Dense[:c.N*s.Dense])
	copy(b.Keys[b.N*s.Cat:], c.Keys[:c.N*s.Cat])
	b.N += c.N
}

// checkRange says what is wrong with a range of n samples.
func checkRange(lo, hi, n int) error {
	if lo < 0 || hi < lo || hi > n {
		return fmt.Errorf("ctrdata: range [%d, %d) outside the %d samples", lo, hi, n)
	}
	return nil
}
