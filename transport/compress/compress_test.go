package compress

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// specs are the codecs under test, top-k at a fraction that leaves most
// coordinates in the residual and at one that sends a third.
var specs = []Spec{{Kind: None}, {Kind: TopK, Fraction: 0.01}, {Kind: TopK, Fraction: 0.3}, {Kind: Int8}, {Kind: Sign}}

// n is not a multiple of 8 (sign's bytes) nor of 256 (int8's chunks).
const n = 1003

// gridVector is n values in [-4, 4] on the grid of multiples of 2^-12:
// sums of a few hundred of them are exact in float32 and float64.
func gridVector(rng *rand.Rand) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.IntN(1<<15+1)-1<<14) / (1 << 12)
	}
	return v
}

// TestFeedbackConservesExactly: over 200 steps of gradients on a grid,
// the sum of what was decoded plus the final residual is the sum of the
// gradients, exactly, for every codec: nothing is lost, only delayed.
func TestFeedbackConservesExactly(t *testing.T) {
	for _, sp := range specs {
		t.Run(sp.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			c := sp.Codec()
			fb := NewFeedback(c, n)
			sent, want := make([]float64, n), make([]float64, n)
			dec := make([]float32, n)
			var buf []byte
			for range 200 {
				g := gridVector(rng)
				var err error
				buf, err = fb.Encode(buf, [][]float32{g[:100], g[100:]})
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Decode(dec, buf); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					sent[i] += float64(dec[i])
					want[i] += float64(g[i])
				}
			}
			for i, r := range fb.Residual() {
				if got := sent[i] + float64(r); got != want[i] {
					t.Fatalf("coordinate %d: decoded %v + residual %v = %v, gradients sum to %v", i, sent[i], r, got, want[i])
				}
			}
		})
	}
}

// wideVector is n values of magnitudes from 2^-30 to 2^10, both signs,
// and a few zeros: no common grid.
func wideVector(rng *rand.Rand) []float32 {
	v := make([]float32, n)
	for i := range v {
		if rng.IntN(50) == 0 {
			continue
		}
		v[i] = float32(math.Ldexp(rng.Float64()+0.5, rng.IntN(40)-30))
		if rng.IntN(2) == 0 {
			v[i] = -v[i]
		}
	}
	return v
}

// TestSplitIsExact: one encode's decoded vector plus the residual it
// keeps is, bit for bit, the residual before plus the vector, for the
// codecs that split exactly (all but sign) on values of any magnitude.
func TestSplitIsExact(t *testing.T) {
	for _, sp := range specs {
		if sp.Kind == Sign {
			continue
		}
		t.Run(sp.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			c := sp.Codec()
			fb := NewFeedback(c, n)
			dec := make([]float32, n)
			for step := range 50 {
				g := wideVector(rng)
				acc := make([]float32, n)
				for i := range acc {
					acc[i] = fb.Residual()[i] + g[i]
				}
				buf, err := fb.Encode(nil, [][]float32{g})
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Decode(dec, buf); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					if r := fb.Residual()[i]; dec[i]+r != acc[i] || acc[i]-dec[i] != r {
						t.Fatalf("step %d, coordinate %d: decoded %v + residual %v != %v", step, i, dec[i], r, acc[i])
					}
				}
			}
		})
	}
}

// TestFeedbackConservesWithinRounding: on values without a common grid,
// decoded sums plus the residual are the gradients' sum to within the
// bound Feedback states: per coordinate, one float32 rounding (2^-24 of
// the accumulated value, two for sign) per step.
func TestFeedbackConservesWithinRounding(t *testing.T) {
	const steps = 100
	for _, sp := range specs {
		t.Run(sp.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			c := sp.Codec()
			fb := NewFeedback(c, n)
			sent, want, bound := make([]float64, n), make([]float64, n), make([]float64, n)
			roundings := 1.0
			if sp.Kind == Sign {
				roundings = 2
			}
			dec := make([]float32, n)
			for range steps {
				g := wideVector(rng)
				buf, err := fb.Encode(nil, [][]float32{g})
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Decode(dec, buf); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					sent[i] += float64(dec[i])
					want[i] += float64(g[i])
					acc := math.Abs(float64(dec[i])) + math.Abs(float64(fb.Residual()[i]))
					bound[i] += roundings * acc * 0x1p-24
				}
			}
			for i, r := range fb.Residual() {
				if d := math.Abs(sent[i] + float64(r) - want[i]); d > bound[i] {
					t.Fatalf("coordinate %d: off by %v, bound %v", i, d, bound[i])
				}
			}
		})
	}
}

// encodeOnce is v's encoding by a fresh Feedback, decoded.
func encodeOnce(t *testing.T, c Codec, v []float32) []float32 {
	t.Helper()
	buf, err := NewFeedback(c, len(v)).Encode(nil, [][]float32{v})
	if err != nil {
		t.Fatal(err)
	}
	if len(buf) != c.EncodedLen(len(v)) {
		t.Fatalf("encoded %d bytes, EncodedLen says %d", len(buf), c.EncodedLen(len(v)))
	}
	dec := make([]float32, len(v))
	if err := c.Decode(dec, buf); err != nil {
		t.Fatal(err)
	}
	return dec
}

func TestNoneIsExact(t *testing.T) {
	v := wideVector(rand.New(rand.NewPCG(7, 8)))
	if dec := encodeOnce(t, Spec{Kind: None}.Codec(), v); !slices.Equal(dec, v) {
		t.Fatal("none changed the vector")
	}
}

// TestTopKSendsTheLargest: k = ceil(fraction*n) coordinates come back
// exactly, the others as 0, and none left out is larger than one sent;
// on short vectors, and on long ones where the threshold's sample
// guesses a bound (a random one; one whose sample holds only zeros; one
// whose sample holds only the largest values, so the guess is too high).
func TestTopKSendsTheLargest(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	short := wideVector(rng)
	short[5], short[6], short[7] = 1e9, -1e9, 1e9 // ties at the top
	long := make([]float32, 100_000)
	for i := range long {
		long[i] = float32(rng.NormFloat64())
	}
	zeroSample, highSample := make([]float32, 100_000), make([]float32, 100_000)
	stride := len(zeroSample) / sampleLen
	for i := range zeroSample {
		if i%stride != 0 {
			zeroSample[i] = float32(rng.NormFloat64())
		} else {
			highSample[i] = 1e6 + float32(i)
		}
		if i%stride == 1 {
			highSample[i] = float32(rng.NormFloat64())
		}
	}
	for name, v := range map[string][]float32{"short": short, "long": long, "zero sample": zeroSample, "high sample": highSample} {
		for _, f := range []float64{0.001, 0.01, 0.05, 0.5, 1} {
			checkTopK(t, name, v, f)
		}
	}
}

func checkTopK(t *testing.T, name string, v []float32, f float64) {
	t.Helper()
	dec := encodeOnce(t, Spec{Kind: TopK, Fraction: f}.Codec(), v)
	k := int(math.Ceil(f * float64(len(v))))
	var sent int
	smallestSent, largestLeft := float32(math.Inf(1)), float32(0)
	for i := range v {
		switch dec[i] {
		case v[i]:
			if v[i] != 0 {
				sent++
				smallestSent = min(smallestSent, abs(v[i]))
			}
		case 0:
			largestLeft = max(largestLeft, abs(v[i]))
		default:
			t.Fatalf("%s, fraction %v: coordinate %d decoded as %v, was %v", name, f, i, dec[i], v[i])
		}
	}
	if sent > k || (sent < k && largestLeft > 0) || largestLeft > smallestSent {
		t.Fatalf("%s, fraction %v: %d sent (k=%d), smallest sent %v, largest left %v", name, f, sent, k, smallestSent, largestLeft)
	}
}

// TestInt8WithinScale: each value within 1/127 of its chunk's largest
// magnitude (half a step of its power-of-two scale).
func TestInt8WithinScale(t *testing.T) {
	v := wideVector(rand.New(rand.NewPCG(11, 12)))
	dec := encodeOnce(t, Spec{Kind: Int8}.Codec(), v)
	for off := 0; off < n; off += chunkLen {
		end := min(off+chunkLen, n)
		var m float32
		for _, x := range v[off:end] {
			m = max(m, abs(x))
		}
		for i := off; i < end; i++ {
			if d := abs(v[i] - dec[i]); d > m/127 {
				t.Fatalf("value %d: %v decoded as %v, off by %v > %v/127", i, v[i], dec[i], d, m)
			}
		}
	}
}

// TestSignKeepsSignsAndMeanMagnitude: each value decodes as ±s with its
// sign (+s for 0), s a power of two within a factor of sqrt 2 of its
// chunk's mean magnitude; a chunk of zeros decodes as zeros.
func TestSignKeepsSignsAndMeanMagnitude(t *testing.T) {
	v := wideVector(rand.New(rand.NewPCG(13, 14)))
	clear(v[256:512])
	dec := encodeOnce(t, Spec{Kind: Sign}.Codec(), v)
	for off := 0; off < n; off += chunkLen {
		end := min(off+chunkLen, n)
		var mean float64
		for _, x := range v[off:end] {
			mean += math.Abs(float64(x)) / float64(end-off)
		}
		s := abs(dec[off])
		if r := float64(s) / mean; mean == 0 && s != 0 || mean != 0 && (r < 1/math.Sqrt2-1e-9 || r > math.Sqrt2+1e-9) {
			t.Fatalf("chunk at %d: scale %v for a mean magnitude %v", off, s, mean)
		}
		for i := off; i < end; i++ {
			if want := float32(math.Copysign(float64(s), float64(v[i]))); dec[i] != want {
				t.Fatalf("value %d: %v decoded as %v, want %v", i, v[i], dec[i], want)
			}
		}
	}
}

// TestNonFiniteDecodesAsNaN: a vector with NaN or Inf is sent so that
// the receiver sees NaN (and refuses it), and the residual is untouched.
func TestNonFiniteDecodesAsNaN(t *testing.T) {
	for _, sp := range specs {
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1)), math.MaxFloat32} {
			c := sp.Codec()
			fb := NewFeedback(c, n)
			fb.residual[3] = math.MaxFloat32
			before := slices.Clone(fb.Residual())
			g := gridVector(rand.New(rand.NewPCG(17, 18)))
			g[3] = bad // MaxFloat32 overflows the residual's sum
			buf, err := fb.Encode(nil, [][]float32{g})
			if err != nil {
				t.Fatal(err)
			}
			dec := make([]float32, n)
			if err := c.Decode(dec, buf); err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(dec, func(x float32) bool { return x != x }) {
				t.Errorf("%s, %v: decoded without a NaN", sp, bad)
			}
			if !slices.Equal(before, fb.Residual()) && sp.Kind != None {
				t.Errorf("%s, %v: residual changed", sp, bad)
			}
		}
	}
}

func TestEncodeRefusesWrongLength(t *testing.T) {
	fb := NewFeedback(Spec{Kind: Int8}.Codec(), n)
	if _, err := fb.Encode(nil, [][]float32{make([]float32, n-1)}); err == nil {
		t.Fatal("encoded a vector shorter than the residual")
	}
}

// TestDecodeRefusesMalformed: the checks a decoder makes beyond length.
func TestDecodeRefusesMalformed(t *testing.T) {
	topk := Spec{Kind: TopK, Fraction: 0.5}.Codec()
	tk := make([]byte, topk.EncodedLen(4)) // indices 0, 0: not increasing
	i8 := make([]byte, Spec{Kind: Int8}.Codec().EncodedLen(4))
	i8[2] = 0x80 // -128
	i8big := make([]byte, len(i8))
	i8big[0] = maxExp + 1
	sg := make([]byte, Spec{Kind: Sign}.Codec().EncodedLen(4))
	sg[1] = 1 << 5 // padding
	for _, c := range []struct {
		codec Codec
		src   []byte
	}{
		{topk, tk}, {topk, append(make([]byte, 4), 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)},
		{topk, tk[:3]}, {Spec{Kind: Int8}.Codec(), i8}, {Spec{Kind: Int8}.Codec(), i8big},
		{Spec{Kind: Sign}.Codec(), sg}, {Spec{Kind: Sign}.Codec(), sg[:1]}, {Spec{Kind: None}.Codec(), []byte{1}},
	} {
		if err := c.codec.Decode(make([]float32, 4), c.src); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s decoded % x: err %v, want ErrMalformed", c.codec.Kind(), c.src, err)
		}
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]Spec{"": {Kind: None}, "none": {Kind: None}, "int8": {Kind: Int8}, "sign": {Kind: Sign},
		"topk:0.01": {Kind: TopK, Fraction: 0.01}, "topk:0.5": {Kind: TopK, Fraction: 0.5}} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if again, err := Parse(got.String()); err != nil || again != got {
			t.Errorf("Parse(%q.String()) = %+v, %v", in, again, err)
		}
	}
	for _, in := range []string{"topk", "topk:", "topk:0", "topk:0.6", "topk:1.5", "topk:-1", "topk:NaN", "int8:2", "sign:1", "bf16", "TOPK:0.1"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted", in)
		}
	}
}

// TestParseSetting: one codec names both directions, PUSH/PULL each;
// String gives back what parses to the same setting.
func TestParseSetting(t *testing.T) {
	topk, i8, none := Spec{Kind: TopK, Fraction: 0.01}, Spec{Kind: Int8}, Spec{Kind: None}
	for in, want := range map[string]struct {
		s   Setting
		off bool
		str string
	}{
		"":               {Setting{none, none}, true, "none"},
		"none/none":      {Setting{none, none}, true, "none"},
		"topk:0.01":      {Setting{topk, topk}, false, "topk:0.01"},
		"topk:0.01/int8": {Setting{topk, i8}, false, "topk:0.01/int8"},
		"none/int8":      {Setting{none, i8}, false, "none/int8"},
		"int8/int8":      {Setting{i8, i8}, false, "int8"},
	} {
		got, err := ParseSetting(in)
		if err != nil || got != want.s || got.Off() != want.off || got.String() != want.str {
			t.Errorf("ParseSetting(%q) = %+v (off %v, %q), %v; want %+v (off %v, %q)", in, got, got.Off(), got.String(), err, want.s, want.off, want.str)
		}
		if again, err := ParseSetting(got.String()); err != nil || again != got {
			t.Errorf("ParseSetting(%q.String()) = %+v, %v", in, again, err)
		}
	}
	for _, in := range []string{"topk:0.01/", "/int8", "int8/int8/int8", "int8/topk", "bf16/int8", "int8 / sign"} {
		if _, err := ParseSetting(in); err == nil {
			t.Errorf("ParseSetting(%q) accepted", in)
		}
	}
}

// TestKthLargest against a sort, on random values and on long runs of
// equal ones.
func TestKthLargest(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	for round := range 300 {
		a := make([]float32, 1+rng.IntN(500))
		for i := range a {
			if round%2 == 0 {
				a[i] = float32(rng.IntN(4))
			} else {
				a[i] = rng.Float32()
			}
		}
		k := 1 + rng.IntN(len(a))
		sorted := slices.Clone(a)
		slices.Sort(sorted)
		if got, want := kthLargest(a, k), sorted[len(a)-k]; got != want {
			t.Fatalf("round %d: %d-th largest of %d = %v, want %v", round, k, len(a), got, want)
		}
	}
}
