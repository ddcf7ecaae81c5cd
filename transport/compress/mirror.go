package compress

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Compressed pulls: a sender (a PS shard) keeps, per receiver (a
// worker), a Mirror: its copy of the vector as the receiver holds it,
// made only of what it sent. An answer is the difference between the
// vector now and that copy, encoded by the codec; the copy then gains
// exactly what the receiver will add. What the codec did not carry is
// still in the next difference: error feedback, with the copy as the
// residual's complement (vector = copy + residual, always). The receiver
// keeps a Replica, bit for bit the sender's copy.
//
// Answers are numbered. A receiver asks with the number of the last
// answer it applied (its base); a sender whose last answer to it has
// that number sends a delta, any other base (0: the receiver holds
// nothing, or an answer was lost on the way, or the sender restarted)
// gets the whole vector, which resets both copies. An answer is
//
//	number u64 | base u64 | kind u8 (0 whole, 1 delta) | body
//
// little-endian: the whole vector as float32, or the codec's encoding of
// the delta. A delta names the base it applies to, and the replica
// refuses one for another base.

// Answer kinds.
const (
	answerWhole = 0
	answerDelta = 1
	answerHead  = 8 + 8 + 1
)

// Mirror is a sender's copy of one receiver's vector. Not safe for
// concurrent use.
type Mirror struct {
	codec   Codec
	held    []float32 // what the receiver holds
	diff    []float32 // the vector minus held, then what the answer left out
	scratch []float32 // the codec's, then the delta decoded
	last    int64     // the last answer's number
}

// NewMirror is a mirror for vectors of n values encoded by codec, whose
// first answer has number first + 1 (first > 0, and unlikely to be a
// number an earlier mirror of the same receiver used: a sender picks it
// at random).
func NewMirror(codec Codec, n int, first int64) *Mirror {
	return &Mirror{codec: codec, held: make([]float32, n), diff: make([]float32, n), scratch: make([]float32, n), last: first}
}

// Len is the length of the vectors.
func (m *Mirror) Len() int { return len(m.held) }

// Answer appends to dst the answer to a receiver whose base is base,
// for the vector v now: a delta when base is the mirror's last answer,
// else v whole. It updates the mirror's copy as the receiver will.
func (m *Mirror) Answer(dst []byte, v []float32, base int64) ([]byte, error) {
	if len(v) != len(m.held) {
		return nil, fmt.Errorf("compress: a vector of %d values for a mirror of %d", len(v), len(m.held))
	}
	num := m.last + 1
	if num <= 0 {
		num = 1
	}
	dst = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(dst, uint64(num)), uint64(base))
	if base == 0 || base != m.last || !m.delta(v) {
		copy(m.held, v)
		m.last = num
		dst = append(dst, answerWhole)
		for _, x := range v {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
		}
		return dst, nil
	}
	dst = append(dst, answerDelta)
	start := len(dst)
	dst = append(dst, make([]byte, m.codec.EncodedLen(len(v)))...)
	m.codec.encode(dst[start:], m.diff, m.scratch)
	dec := m.scratch
	if err := m.codec.Decode(dec, dst[start:]); err != nil {
		return nil, fmt.Errorf("compress: decoding its own delta: %w", err)
	}
	for i, d := range dec {
		m.held[i] += d
	}
	m.last = num
	return dst, nil
}

// delta sets diff to v minus the copy and says whether it is finite.
func (m *Mirror) delta(v []float32) bool {
	var inf float32
	for i, x := range v {
		d := x - m.held[i]
		m.diff[i] = d
		inf += d * 0
	}
	return !math.IsNaN(float64(inf))
}

// Replica is a receiver's vector, as a Mirror's answers build it. Not
// safe for concurrent use.
type Replica struct {
	codec Codec
	held  []float32
	dec   []float32
	base  int64 // the last answer applied (0: none)
}

// NewReplica is a replica of n values, holding nothing yet.
func NewReplica(codec Codec, n int) *Replica {
	return &Replica{codec: codec, held: make([]float32, n), dec: make([]float32, n)}
}

// Base is the number of the last answer applied, to send with the next
// request (0: none; the answer will be whole).
func (r *Replica) Base() int64 { return r.base }

// Values is the vector as the replica holds it (valid until the next
// Apply; the caller must not change it).
func (r *Replica) Values() []float32 { return r.held }

// WholeValues says how many values ans carries if it is a whole answer
// (known false for a delta, or for bytes that are no whole answer).
func WholeValues(ans []byte) (n int, known bool) {
	if len(ans) < answerHead || ans[16] != answerWhole || (len(ans)-answerHead)%4 != 0 {
		return 0, false
	}
	return (len(ans) - answerHead) / 4, true
}

// Apply applies an answer. A malformed one (ErrMalformed), or a delta
// for another base than the replica's, leaves the replica holding
// nothing (base 0), so the next answer is whole.
func (r *Replica) Apply(ans []byte) error {
	err := r.apply(ans)
	if err != nil {
		r.base = 0
	}
	return err
}

func (r *Replica) apply(ans []byte) error {
	n := len(r.held)
	if len(ans) < answerHead {
		return malformed("answer of %d bytes, shorter than its head", len(ans))
	}
	num := int64(binary.LittleEndian.Uint64(ans))
	base := int64(binary.LittleEndian.Uint64(ans[8:]))
	body := ans[answerHead:]
	switch {
	case num <= 0:
		return malformed("answer number %d", num)
	case ans[16] == answerWhole && len(body) == 4*n:
		for i := range r.held {
			r.held[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
		}
	case ans[16] == answerDelta && (r.base == 0 || base != r.base):
		return malformed("a delta to answer %d, the replica holds answer %d", base, r.base)
	case ans[16] == answerDelta:
		if err := r.codec.Decode(r.dec, body); err != nil {
			return err
		}
		var inf float32
		for _, d := range r.dec {
			inf += d * 0
		}
		if math.IsNaN(float64(inf)) {
			return malformed("a delta with NaN or Inf (a mirror sends such a vector whole)")
		}
		for i, d := range r.dec {
			r.held[i] += d
		}
	default:
		return malformed("answer kind %d with %d bytes for %d values", ans[16], len(body), n)
	}
	r.base = num
	return nil
}
