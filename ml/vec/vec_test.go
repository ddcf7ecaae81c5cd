package vec

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// lengths cover empty, shorter than a block, whole blocks and blocks
// with every tail length.
var lengths = []int{0, 1, 7, 15, 16, 17, 31, 32, 33, 47, 100, 1000, 4099}

// values are gradients and weights of every magnitude, denormals and
// zeros of both signs included.
func values(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		switch r.IntN(20) {
		case 0:
			x[i] = 0
		case 1:
			x[i] = float32(math.Copysign(0, -1))
		case 2:
			x[i] = math.Float32frombits(r.Uint32() & 0x807fffff) // denormal
		default:
			x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(12)-8)))
		}
	}
	return x
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d of %d is %v (%#x), the Go loop gives %v (%#x)",
				what, i, len(want), got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

func clone(x []float32) []float32 { return append([]float32(nil), x...) }

// Each kernel gives what its Go loop gives, bit for bit, whatever the
// length (the assembly takes the whole blocks, Go the tail).
func TestKernelsMatchTheGoLoops(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	const mu, lr, scale = 0.9, 0.2, 0.5
	for _, n := range lengths {
		p, v, acc, g := values(r, n), values(r, n), values(r, n), values(r, n)

		p1, v1, acc1 := clone(p), clone(v), clone(acc)
		MomentumSum(p1, v1, acc1, g, mu, lr, scale)
		p2, v2, acc2 := clone(p), clone(v), clone(acc)
		momentumSumGo(p2, v2, acc2, g, mu, lr, scale)
		sameBits(t, "MomentumSum p", p1, p2)
		sameBits(t, "MomentumSum v", v1, v2)
		sameBits(t, "MomentumSum acc", acc1, acc2)
		for i, a := range acc1 {
			if a != 0 {
				t.Fatalf("MomentumSum left acc[%d] = %v", i, a)
			}
		}

		p1, v1 = clone(p), clone(v)
		Momentum(p1, v1, g, mu, lr, scale)
		p2, v2 = clone(p), clone(v)
		momentumGo(p2, v2, g, mu, lr, scale)
		sameBits(t, "Momentum p", p1, p2)
		sameBits(t, "Momentum v", v1, v2)

		a1, a2 := clone(acc), clone(acc)
		Add(a1, g)
		addGo(a2, g)
		sameBits(t, "Add", a1, a2)

		var l [Lanes]float64
		sumSquaresGo(g, 0, &l)
		var s [Lanes / 2]float64
		for i := range s {
			s[i] = l[i] + l[i+Lanes/2]
		}
		want := ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
		if got := SumSquares(g); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("SumSquares of %d values = %v, the Go loop gives %v", n, got, want)
		}
		var plain float64
		for _, x := range g {
			plain += float64(x) * float64(x)
		}
		if got := SumSquares(g); math.Abs(got-plain) > 1e-12*plain {
			t.Fatalf("SumSquares of %d values = %v, a plain sum %v", n, got, plain)
		}
	}
}

// The network's kernels give their Go loops' results bit for bit, with
// zeros of both signs and NaNs among the values.
func TestNetworkKernelsMatchTheGoLoops(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.NaN()), float32(math.Inf(-1)), float32(math.Inf(1))}
	for _, n := range lengths {
		x, bias, d, act := values(r, n), values(r, n), values(r, n), values(r, n)
		for i := 0; i < n; i += 7 {
			x[i] = special[i%len(special)]
			act[(i*3)%n] = special[(i/7)%len(special)]
		}
		x1, x2 := clone(x), clone(x)
		AddReLU(x1, bias)
		addReLUGo(x2, bias)
		sameBits(t, "AddReLU", x1, x2)

		d1, d2 := clone(d), clone(d)
		MaskNonPositive(d1, act)
		maskGo(d2, act)
		sameBits(t, "MaskNonPositive", d1, d2)

		px := make([]uint8, n)
		for i := range px {
			px[i] = uint8(r.IntN(256))
		}
		p1, p2 := make([]float32, n), make([]float32, n)
		Pixels(p1, px)
		pixelsGo(p2, px)
		sameBits(t, "Pixels", p1, p2)
	}
	// Every byte, through the blocks.
	px := make([]uint8, 256)
	for i := range px {
		px[i] = uint8(i)
	}
	got := make([]float32, 256)
	Pixels(got, px)
	for i, v := range got {
		if want := float32(i) / 255; math.Float32bits(v) != math.Float32bits(want) {
			t.Fatalf("Pixels(%d) = %v, want %v", i, v, want)
		}
	}
}

// The kernels leave the values past the slices they are given alone.
func TestKernelsStayInBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range lengths {
		const pad = 32
		p, v, acc := values(r, n+pad), values(r, n+pad), values(r, n+pad)
		g := values(r, n)
		p0, v0, acc0 := clone(p), clone(v), clone(acc)
		MomentumSum(p[:n], v[:n], acc[:n], g, 0.9, 0.1, 1)
		Momentum(p[:n], v[:n], g, 0.9, 0.1, 1)
		Add(acc[:n], g)
		AddReLU(v[:n], g)
		MaskNonPositive(p[:n], g)
		sameBits(t, "p past the end", p[n:], p0[n:])
		sameBits(t, "v past the end", v[n:], v0[n:])
		sameBits(t, "acc past the end", acc[n:], acc0[n:])
	}
}

// A NaN or an Inf anywhere, in the blocks or the tail, makes the sum
// of squares NaN or +Inf; finite values never do.
func TestSumSquaresFlagsNonFinite(t *testing.T) {
	for _, n := range []int{1, 16, 17, 100} {
		for _, at := range []int{0, n / 2, n - 1} {
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
				x := make([]float32, n)
				for i := range x {
					x[i] = 1
				}
				x[at] = bad
				if s := SumSquares(x); !math.IsNaN(s) && !math.IsInf(s, 1) {
					t.Errorf("n %d, %v at %d: SumSquares = %v", n, bad, at, s)
				}
			}
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = math.MaxFloat32
		}
		if s := SumSquares(x); math.IsInf(s, 0) || math.IsNaN(s) {
			t.Errorf("n %d of MaxFloat32: SumSquares = %v, want finite", n, s)
		}
	}
}

// On an AVX2 machine the blocks go to the assembly.
func TestBulkUsesTheAssembly(t *testing.T) {
	if !avx2Available() {
		t.Skip("no AVX2 assembly in this build or on this CPU")
	}
	if got := bulk(40); got != 32 {
		t.Errorf("bulk(40) = %d, want 32", got)
	}
}

// BenchmarkKernels times each kernel on a default shard (318,400 values)
// against its Go loop.
func BenchmarkKernels(b *testing.B) {
	const n = 318400
	r := rand.New(rand.NewPCG(1, 2))
	p, v, acc, g := values(r, n), values(r, n), values(r, n), values(r, n)
	for _, k := range []struct {
		name string
		f    func()
	}{
		{"MomentumSum", func() { MomentumSum(p, v, acc, g, 0.9, 0.1, 0.5) }},
		{"MomentumSum/go", func() { momentumSumGo(p, v, acc, g, 0.9, 0.1, 0.5) }},
		{"Add", func() { Add(acc, g) }},
		{"Add/go", func() { addGo(acc, g) }},
		{"SumSquares", func() { SumSquares(g) }},
		{"SumSquares/go", func() {
			var l [Lanes]float64
			sumSquaresGo(g, 0, &l)
		}},
	} {
		b.Run(k.name, func(b *testing.B) {
			b.SetBytes(4 * n)
			for b.Loop() {
				k.f()
			}
		})
	}
}

// MaxPoolRow and UnpoolRow give, bit for bit, what their windows one at
// a time give in Go (maxPool4Go, and unpool4Go, whose routing and bias
// sums are checked against their definition), ties included, for
// channel counts the assembly takes (multiples of 8) and others, and
// write nothing outside the windows.
func TestPoolRowsAreTheirWindows(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 43))
	for _, c := range []int{8, 16, 32, 7, 3} {
		for _, w := range []int{0, 1, 3, 12} {
			row := 2*w*c + c*r.IntN(2) // an odd map width leaves a column out
			row = max(row, 2*c)
			n := row + 2*w*c
			base := int32(1000)
			out, bias := values(r, n+5), values(r, c)
			for i := range out { // ties between positions, and NaNs
				switch r.IntN(8) {
				case 0, 1:
					out[i] = out[r.IntN(len(out))]
				case 2:
					out[i] = float32(math.NaN())
				}
			}
			pool, arg := make([]float32, w*c+3), make([]int32, w*c+3) // a tail not to write
			wpool, warg := make([]float32, w*c+3), make([]int32, w*c+3)
			MaxPoolRow(out[:n], bias, pool[:w*c], arg[:w*c], base, int32(c), int32(row))
			for i := range w {
				o, p := 2*i*c, i*c
				maxPool4Go(out[o:o+c], out[o+c:o+2*c], out[o+row:o+row+c], out[o+row+c:o+row+2*c],
					bias, wpool[p:p+c], warg[p:p+c], base+int32(o), int32(c), int32(row))
			}
			sameBits(t, "MaxPoolRow pool", pool, wpool)
			if !slices.Equal(arg, warg) {
				t.Fatalf("c %d w %d: MaxPoolRow's positions %v, its windows' %v", c, w, arg, warg)
			}

			dPool := values(r, w*c)
			dOut, wdOut := values(r, n+5), make([]float32, n+5)
			copy(wdOut, dOut)
			dBias, wdBias := values(r, c+3), make([]float32, c+3)
			copy(wdBias, dBias)
			UnpoolRow(dPool, pool[:w*c], arg[:w*c], dOut[:n], dBias[:c], base, int32(c), int32(row))
			for i := range w {
				o, p := 2*i*c, i*c
				unpool4Go(dPool[p:p+c], pool[p:p+c], arg[p:p+c], wdOut[o:o+c], wdOut[o+c:o+2*c], wdOut[o+row:o+row+c],
					wdOut[o+row+c:o+row+2*c], wdBias, base+int32(o), int32(c), int32(row))
			}
			sameBits(t, "UnpoolRow dOut", dOut, wdOut)
			sameBits(t, "UnpoolRow dBias", dBias, wdBias)
		}
	}
}

// unpool4Go routes each gradient that passed the pool to the position
// its offset names, +0 to the window's others and to all four where it
// did not pass, and adds it into the bias gradient.
func TestUnpoolWindowIsItsDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(47, 53))
	const n, base, c, row = 100, 1000, 100, 300
	offs := [4]int32{0, c, row, row + c}
	dPool, pool, bias := values(r, n), values(r, n), values(r, n)
	arg := make([]int32, n)
	for j := range arg {
		arg[j] = base + int32(j) + offs[r.IntN(4)]
	}
	var d [4][]float32
	for k := range d {
		d[k] = values(r, n)
	}
	dBias := slices.Clone(bias)
	unpool4Go(dPool, pool, arg, d[0], d[1], d[2], d[3], dBias, base, c, row)
	for j := range n {
		g := float32(0)
		if pool[j] > 0 {
			g = dPool[j]
		}
		for k := range d {
			w := float32(0)
			if arg[j]-base-int32(j) == offs[k] {
				w = g
			}
			if math.Float32bits(d[k][j]) != math.Float32bits(w) {
				t.Fatalf("position %d of channel %d = %v, want %v", k, j, d[k][j], w)
			}
		}
		if b := bias[j] + g; math.Float32bits(dBias[j]) != math.Float32bits(b) {
			t.Fatalf("dBias[%d] = %v, want %v", j, dBias[j], b)
		}
	}
}
