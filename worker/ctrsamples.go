package worker

import (
	"fmt"
	"math"

	"github.com/pstrain/pstrain/ml/ctrdata"
)

// CTRSamples is a data shard of CTR samples held in memory, as the
// worker's batch source reads them (dataset.Samples): each sample
// encoded by EncodeCTR. Its keys are held in 32 bits while every key
// fits (a synthetic set's and Criteo's ids do), else in 64: 157 bytes a
// sample of Criteo's shape instead of 261.
type CTRSamples struct {
	schema ctrdata.Schema
	n      int
	labels []uint8
	dense  []float32
	keys32 []uint32 // nil once a key did not fit
	keys64 []uint64 // nil while keys32 holds the keys
}

// NewCTRSamplesCap holds no samples yet, and room for capacity.
func NewCTRSamplesCap(s ctrdata.Schema, capacity int) *CTRSamples {
	return &CTRSamples{schema: s, labels: make([]uint8, capacity), dense: make([]float32, capacity*s.Dense),
		keys32: make([]uint32, capacity*s.Cat)}
}

// NewCTRSamples holds the samples of b (a copy).
func NewCTRSamples(b *ctrdata.Batch) *CTRSamples {
	s := NewCTRSamplesCap(b.Schema, b.N)
	_ = s.Append(b) // b.N samples fit
	return s
}

// Append adds b's samples after those held.
func (s *CTRSamples) Append(b *ctrdata.Batch) error {
	if b.Schema != s.schema {
		return fmt.Errorf("worker: appending samples of %+v to samples of %+v", b.Schema, s.schema)
	}
	if s.n+b.N > len(s.labels) {
		return fmt.Errorf("worker: %d samples appended to %d of room for %d", b.N, s.n, len(s.labels))
	}
	d, c := s.schema.Dense, s.schema.Cat
	copy(s.labels[s.n:], b.Labels[:b.N])
	copy(s.dense[s.n*d:], b.Dense[:b.N*d])
	keys := b.Keys[:b.N*c]
	if s.keys32 != nil && !fits32(keys) {
		s.widen()
	}
	if s.keys64 != nil {
		copy(s.keys64[s.n*c:], keys)
	} else {
		for j, k := range keys {
			s.keys32[s.n*c+j] = uint32(k)
		}
	}
	s.n += b.N
	return nil
}

func fits32(keys []uint64) bool {
	for _, k := range keys {
		if k > math.MaxUint32 {
			return false
		}
	}
	return true
}

// widen moves the keys to 64 bits.
func (s *CTRSamples) widen() {
	s.keys64 = make([]uint64, len(s.keys32))
	for j, k := range s.keys32[:s.n*s.schema.Cat] {
		s.keys64[j] = uint64(k)
	}
	s.keys32 = nil
}

// key is sample i's key of field f.
func (s *CTRSamples) key(i, f int) uint64 {
	if s.keys64 != nil {
		return s.keys64[i*s.schema.Cat+f]
	}
	return uint64(s.keys32[i*s.schema.Cat+f])
}

// Shape implements dataset.Samples.
func (s *CTRSamples) Shape() (n, dim int) { return s.n, CTRWidth(s.schema) }

// Sample implements dataset.Samples: sample i encoded as EncodeCTR does.
func (s *CTRSamples) Sample(i int, x []float32) uint8 {
	d := s.schema.Dense
	copy(x[:d], s.dense[i*d:(i+1)*d])
	for f := range s.schema.Cat {
		k := s.key(i, f)
		x[d+2*f] = math.Float32frombits(uint32(k))
		x[d+2*f+1] = math.Float32frombits(uint32(k >> 32))
	}
	return s.labels[i]
}

// HeldBytes is the memory the samples hold.
func (s *CTRSamples) HeldBytes() int {
	return len(s.labels) + 4*len(s.dense) + 4*len(s.keys32) + 8*len(s.keys64)
}
