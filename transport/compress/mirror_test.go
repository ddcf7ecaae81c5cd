package compress

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// walk moves v by a step of small random updates, a few of them large,
// as a shard's parameters move between pulls.
func walk(rng *rand.Rand, v []float32) {
	for i := range v {
		v[i] += float32(rng.NormFloat64()) * 1e-3
		if rng.IntN(100) == 0 {
			v[i] += float32(rng.NormFloat64())
		}
	}
}

// TestReplicaIsTheMirrorsCopy: over pulls of a moving vector, the
// receiver's replica is bit for bit the sender's copy after every
// answer, and the first answer is whole.
func TestReplicaIsTheMirrorsCopy(t *testing.T) {
	for _, sp := range specs {
		t.Run(sp.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(21, 22))
			c := sp.Codec()
			v := wideVector(rng)
			m, r := NewMirror(c, n, 41), NewReplica(c, n)
			var buf []byte
			for step := range 60 {
				var err error
				buf, err = m.Answer(buf[:0], v, r.Base())
				if err != nil {
					t.Fatal(err)
				}
				if whole := buf[16] == answerWhole; whole != (step == 0) {
					t.Fatalf("step %d: answer whole %v", step, whole)
				}
				if err := r.Apply(buf); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if !slices.Equal(r.Values(), m.held) {
					t.Fatalf("step %d: the replica differs from the mirror's copy", step)
				}
				walk(rng, v)
			}
		})
	}
}

// TestReplicaConverges: once the vector stops moving, further pulls
// bring the replica to it: exactly for the codecs that split exactly
// (top-k sends every coordinate within 1/fraction pulls, int8 shrinks
// the difference 127-fold a pull); sign, whose one scale is far too
// large for most coordinates and too small for a few, only on average:
// the mean difference falls tenfold.
func TestReplicaConverges(t *testing.T) {
	for _, sp := range specs {
		t.Run(sp.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(23, 24))
			c := sp.Codec()
			v := wideVector(rng)
			m, r := NewMirror(c, n, 1), NewReplica(c, n)
			pull := func() {
				b, err := m.Answer(nil, v, r.Base())
				if err == nil {
					err = r.Apply(b)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			pull()
			for range 5 {
				walk(rng, v)
				pull()
			}
			start := meanDiff(v, r.Values())
			for range 110 {
				pull()
			}
			if d := meanDiff(v, r.Values()); (sp.Kind != Sign && d != 0) || d > start/10 {
				t.Fatalf("after 110 pulls of a still vector: mean difference %v (from %v)", d, start)
			}
		})
	}
}

func meanDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d += math.Abs(float64(a[i])-float64(b[i])) / float64(len(a))
	}
	return d
}

// TestLostAnswerSendsWhole: an answer the receiver never applied (a
// pull cut short) makes the next answer whole; both copies agree again.
func TestLostAnswerSendsWhole(t *testing.T) {
	c := Spec{Kind: TopK, Fraction: 0.01}.Codec()
	rng := rand.New(rand.NewPCG(25, 26))
	v := wideVector(rng)
	m, r := NewMirror(c, n, 7), NewReplica(c, n)
	b, _ := m.Answer(nil, v, r.Base())
	if err := r.Apply(b); err != nil {
		t.Fatal(err)
	}
	walk(rng, v)
	if _, err := m.Answer(nil, v, r.Base()); err != nil { // lost
		t.Fatal(err)
	}
	walk(rng, v)
	b, _ = m.Answer(nil, v, r.Base())
	if b[16] != answerWhole {
		t.Fatal("after a lost answer, a delta")
	}
	if err := r.Apply(b); err != nil || !slices.Equal(r.Values(), v) || !slices.Equal(m.held, v) {
		t.Fatalf("after a whole answer: %v, copies equal the vector: %v %v", err, slices.Equal(r.Values(), v), slices.Equal(m.held, v))
	}
}

// TestReplicaRefusesDeltaForAnotherBase: a delta for an answer the
// replica does not hold is refused, and the replica then asks whole.
func TestReplicaRefusesDeltaForAnotherBase(t *testing.T) {
	c := Spec{Kind: Int8}.Codec()
	v := gridVector(rand.New(rand.NewPCG(27, 28)))
	m, r, other := NewMirror(c, n, 100), NewReplica(c, n), NewReplica(c, n)
	b, _ := m.Answer(nil, v, 0)
	if err := r.Apply(b); err != nil {
		t.Fatal(err)
	}
	b, _ = m.Answer(nil, v, r.Base())
	if b[16] != answerDelta {
		t.Fatal("a whole answer to the base the mirror answered last")
	}
	if err := other.Apply(b); !errors.Is(err, ErrMalformed) || other.Base() != 0 {
		t.Fatalf("a replica holding nothing applied a delta: %v, base %d", err, other.Base())
	}
}

// FuzzReplicaApply applies arbitrary answers to a replica that holds an
// answer: never a panic, every refusal ErrMalformed, and after one the
// replica holds nothing.
func FuzzReplicaApply(f *testing.F) {
	v := []float32{1, -2, 3, 0, 5, -6, 7, 8, 9, 0.5, -0.25}
	for _, sp := range specs {
		m := NewMirror(sp.Codec(), len(v), 1)
		first, _ := m.Answer(nil, v, 0)
		v[2]++
		delta, _ := m.Answer(nil, v, 2)
		f.Add(first, uint8(0))
		f.Add(delta, uint8(0))
	}
	f.Fuzz(func(t *testing.T, ans []byte, which uint8) {
		sp := specs[int(which)%len(specs)]
		m, r := NewMirror(sp.Codec(), 11, 1), NewReplica(sp.Codec(), 11)
		b, _ := m.Answer(nil, make([]float32, 11), 0)
		if err := r.Apply(b); err != nil {
			t.Fatal(err)
		}
		if err := r.Apply(ans); err != nil && (!errors.Is(err, ErrMalformed) || r.Base() != 0) {
			t.Fatalf("%s: %v (base %d)", sp, err, r.Base())
		}
	})
}

// TestWholeValues: a whole answer tells how many values it carries, a
// delta or a cut one does not.
func TestWholeValues(t *testing.T) {
	c := Spec{Kind: TopK, Fraction: 0.01}.Codec()
	rng := rand.New(rand.NewPCG(27, 28))
	v := wideVector(rng)
	m, r := NewMirror(c, n, 7), NewReplica(c, n)
	whole, _ := m.Answer(nil, v, r.Base())
	if got, known := WholeValues(whole); !known || got != n {
		t.Fatalf("a whole answer: %d values (known %v), want %d", got, known, n)
	}
	if err := r.Apply(whole); err != nil {
		t.Fatal(err)
	}
	walk(rng, v)
	delta, _ := m.Answer(nil, v, r.Base())
	if delta[16] != answerDelta {
		t.Fatal("the second answer is not a delta")
	}
	for name, ans := range map[string][]byte{"delta": delta, "cut head": whole[:answerHead-1], "cut value": whole[:len(whole)-1]} {
		if got, known := WholeValues(ans); known {
			t.Errorf("%s: %d values, want unknown", name, got)
		}
	}
}
