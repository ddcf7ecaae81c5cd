// Package vec holds the float32 loops of a training step that Go would
// run one value at a time: a parameter server's passes over its whole
// shard (the momentum update, adding a gradient into the step's sum, a
// gradient's sum of squares: its norm, and whether it is finite; and
// those passes fused, so that the PS reads a gradient as few times as it
// can: MomentumStep, MomentumSumStep, AddBoth, CopySumSquares) and a
// worker's element-wise passes (bias and ReLU, the ReLU's gradient mask,
// bytes to pixel values, the CNN's max pool and its gradient: MaxPoolRow,
// UnpoolRow). On amd64 with AVX2 they run eight values to an
// instruction; elsewhere, and built with -tags purego, in Go.
//
// Both paths give the same results bit for bit: each value goes through
// the same float32 operations in the same order (a product and a sum are
// rounded one at a time: the assembly has no fused multiply-add, and the
// Go loops convert each product explicitly, which keeps the compiler
// from fusing it where it would: arm64, amd64 with GOAMD64=v3), and
// SumSquares adds into the same Lanes partial sums, combined in the same
// order. A shard and its standby, or a run and its replay, agree
// whichever path they take.
//
// Why: Go does not vectorise loops, and the scalar momentum update took
// ~0.6 ns a value, in cache or out, ~190 µs per default shard and step,
// with the gradient's norm and sum another ~0.35 ns; a step's last
// push waits for all of it (docs/scaling.md, "The levers in the code").
package vec

import "math"

// Lanes is how many partial sums SumSquares keeps: value i goes into
// partial sum i % Lanes.
const Lanes = 16

// MomentumSum is the momentum update by the gradient scale*(acc+g), with
// acc zeroed: for each i, v = mu*v + scale*(acc+g); p -= lr*v; acc = 0.
// The slices' lengths must be equal.
func MomentumSum(p, v, acc, g []float32, mu, lr, scale float32) {
	n := len(g)
	p, v, acc = p[:n], v[:n], acc[:n]
	k := bulk(n)
	if k > 0 {
		momentumSumBulk(p[:k], v[:k], acc[:k], g[:k], mu, lr, scale)
	}
	momentumSumGo(p[k:], v[k:], acc[k:], g[k:], mu, lr, scale)
}

// Momentum is the momentum update by the gradient scale*g: for each i,
// v = mu*v + scale*g; p -= lr*v.
func Momentum(p, v, g []float32, mu, lr, scale float32) {
	n := len(g)
	p, v = p[:n], v[:n]
	k := bulk(n)
	if k > 0 {
		momentumBulk(p[:k], v[:k], g[:k], mu, lr, scale)
	}
	momentumGo(p[k:], v[k:], g[k:], mu, lr, scale)
}

// MomentumStep is a parameter server's whole update by one gradient in
// one pass over it: Momentum(p, v, g, mu, lr, scale), then Add(sum, g),
// then copy(out, p), bit for bit, but reading g, p and v once. sum is
// where the shard sums a worker's gradients (attribution), out where it
// keeps the updated parameters for its pulls; out may be p itself (no
// copy wanted). The slices' lengths must be equal.
func MomentumStep(p, v, g, sum, out []float32, mu, lr, scale float32) {
	n := len(g)
	p, v, sum, out = p[:n], v[:n], sum[:n], out[:n]
	k := bulk(n)
	if k > 0 {
		momentumStepBulk(p[:k], v[:k], g[:k], sum[:k], out[:k], mu, lr, scale)
	}
	momentumStepGo(p[k:], v[k:], g[k:], sum[k:], out[k:], mu, lr, scale)
}

// MomentumSumStep is MomentumStep by the gradient scale*(acc+g), acc
// zeroed: MomentumSum(p, v, acc, g, mu, lr, scale), then Add(sum, g),
// then copy(out, p), bit for bit, in one pass (a sync step's last
// gradient: only g goes into sum, acc holding the other workers'). out
// may be p. The slices' lengths must be equal.
func MomentumSumStep(p, v, acc, g, sum, out []float32, mu, lr, scale float32) {
	n := len(g)
	p, v, acc, sum, out = p[:n], v[:n], acc[:n], sum[:n], out[:n]
	k := bulk(n)
	if k > 0 {
		momentumSumStepBulk(p[:k], v[:k], acc[:k], g[:k], sum[:k], out[:k], mu, lr, scale)
	}
	momentumSumStepGo(p[k:], v[k:], acc[k:], g[k:], sum[k:], out[k:], mu, lr, scale)
}

// AddBoth is Add(a, src) and Add(b, src) in one pass over src. len(a)
// and len(b) must be at least len(src).
func AddBoth(a, b, src []float32) {
	n := len(src)
	a, b = a[:n], b[:n]
	k := bulk(n)
	if k > 0 {
		addBothBulk(a[:k], b[:k], src[:k])
	}
	addBothGo(a[k:], b[k:], src[k:])
}

// Add adds src into dst: dst[i] += src[i]. len(dst) must be at least
// len(src).
func Add(dst, src []float32) {
	n := len(src)
	dst = dst[:n]
	k := bulk(n)
	if k > 0 {
		addBulk(dst[:k], src[:k])
	}
	addGo(dst[k:], src[k:])
}

// SumSquares is the sum of x's squares in float64: NaN or +Inf if x
// holds a NaN or an Inf, and only then (squares of float32 values cannot
// overflow a float64 sum of fewer than 2^900 of them), so one pass both
// checks that a gradient is finite and gives its norm.
func SumSquares(x []float32) float64 {
	var l [Lanes]float64
	k := bulk(len(x))
	if k > 0 {
		sumSquaresBulk(x[:k], &l)
	}
	sumSquaresGo(x[k:], k, &l)
	return combineLanes(&l)
}

// copyChunk is how many values CopySumSquares copies before it reads
// them back: a multiple of Lanes, and small enough that they are still
// in the core's first-level cache.
const copyChunk = 2048

// CopySumSquares copies src into dst and returns SumSquares(dst), bit
// for bit, reading src once: a chunk at a time is copied, then squared
// from the cache while the next one streams in. So what it returns is
// the sum of squares of the values dst holds, whatever writes src
// meanwhile (a gradient copied out of a region its worker shares).
// len(dst) must be at least len(src).
func CopySumSquares(dst, src []float32) float64 {
	n := len(src)
	dst = dst[:n]
	var l [Lanes]float64
	k := bulk(n)
	for i := 0; i < k; i += copyChunk {
		j := min(i+copyChunk, k)
		copy(dst[i:j], src[i:j])
		sumSquaresBulk(dst[i:j], &l) // (the lanes' sums go on from chunk to chunk)
	}
	copy(dst[k:], src[k:])
	sumSquaresGo(dst[k:], k, &l)
	return combineLanes(&l)
}

// combineLanes adds the partial sums up in a fixed order, the same on
// every path.
func combineLanes(l *[Lanes]float64) float64 {
	var s [Lanes / 2]float64
	for i := range s {
		s[i] = l[i] + l[i+Lanes/2]
	}
	return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

func momentumSumGo(p, v, acc, g []float32, mu, lr, scale float32) {
	p, v, acc = p[:len(g)], v[:len(g)], acc[:len(g)]
	for i, x := range g {
		// The conversions round each product on its own: without them
		// the compiler may fuse a product into the sum (arm64, amd64 with
		// GOAMD64=v3), which the assembly does not.
		vi := float32(mu*v[i]) + float32(scale*(acc[i]+x))
		v[i] = vi
		p[i] -= float32(lr * vi)
		acc[i] = 0
	}
}

func momentumGo(p, v, g []float32, mu, lr, scale float32) {
	p, v = p[:len(g)], v[:len(g)]
	for i, x := range g {
		vi := float32(mu*v[i]) + float32(scale*x) // (no fusion: see momentumSumGo)
		v[i] = vi
		p[i] -= float32(lr * vi)
	}
}

func momentumStepGo(p, v, g, sum, out []float32, mu, lr, scale float32) {
	p, v, sum, out = p[:len(g)], v[:len(g)], sum[:len(g)], out[:len(g)]
	for i, x := range g {
		sum[i] += x
		vi := float32(mu*v[i]) + float32(scale*x) // (no fusion: see momentumSumGo)
		v[i] = vi
		pi := p[i] - float32(lr*vi)
		p[i], out[i] = pi, pi
	}
}

func momentumSumStepGo(p, v, acc, g, sum, out []float32, mu, lr, scale float32) {
	p, v, acc, sum, out = p[:len(g)], v[:len(g)], acc[:len(g)], sum[:len(g)], out[:len(g)]
	for i, x := range g {
		sum[i] += x
		vi := float32(mu*v[i]) + float32(scale*(acc[i]+x)) // (no fusion: see momentumSumGo)
		v[i] = vi
		pi := p[i] - float32(lr*vi)
		p[i], out[i] = pi, pi
		acc[i] = 0
	}
}

func addBothGo(a, b, src []float32) {
	a, b = a[:len(src)], b[:len(src)]
	for i, x := range src {
		a[i] += x
		b[i] += x
	}
}

func addGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] += x
	}
}

// sumSquaresGo adds the squares of x, whose first value is value first
// of the whole, into their partial sums.
func sumSquaresGo(x []float32, first int, l *[Lanes]float64) {
	for i, v := range x {
		f := float64(v)
		l[(first+i)%Lanes] += float64(f * f) // (no fusion: see momentumSumGo)
	}
}

// AddReLU adds bias into x and takes the ReLU: for each i, v = x[i] +
// bias[i], and x[i] = v, or +0 where v < 0. Without a branch: the signs
// of a hidden layer are random, and a branch on them mispredicted half
// the time. len(x) must be at least len(bias).
func AddReLU(x, bias []float32) {
	n := len(bias)
	x = x[:n]
	k := bulk(n)
	if k > 0 {
		addReLUBulk(x[:k], bias[:k])
	}
	addReLUGo(x[k:], bias[k:])
}

// MaskNonPositive zeroes d where act is not positive (the gradient
// through a ReLU whose output was act): d[i] becomes +0 where act[i] <=
// 0, and stays where act[i] > 0 or is NaN. len(d) must be at least
// len(act).
func MaskNonPositive(d, act []float32) {
	n := len(act)
	d = d[:n]
	k := bulk(n)
	if k > 0 {
		maskBulk(d[:k], act[:k])
	}
	maskGo(d[k:], act[k:])
}

// Pixels converts stored pixels to the values a network reads: dst[i] =
// float32(src[i]) / 255. len(dst) must be at least len(src).
func Pixels(dst []float32, src []uint8) {
	n := len(src)
	dst = dst[:n]
	k := bulk(n)
	if k > 0 {
		pixelsBulk(dst[:k], src[:k])
	}
	pixelsGo(dst[k:], src[k:])
}

func addReLUGo(x, bias []float32) {
	x = x[:len(bias)]
	for i, b := range bias {
		v := x[i] + b
		var neg uint32
		if v < 0 {
			neg = math.MaxUint32
		}
		x[i] = math.Float32frombits(math.Float32bits(v) &^ neg)
	}
}

func maskGo(d, act []float32) {
	d = d[:len(act)]
	for i, a := range act {
		var off uint32
		if a <= 0 {
			off = math.MaxUint32
		}
		d[i] = math.Float32frombits(math.Float32bits(d[i]) &^ off)
	}
}

func pixelsGo(dst []float32, src []uint8) {
	dst = dst[:len(src)]
	for i, b := range src {
		dst[i] = float32(b) / 255
	}
}

// maxPool4Go pools one window of len(r0) channels: for each j, the
// first maximum m of r0[j], r1[j], r2[j], r3[j] (a later value wins only
// if it is greater, so a NaN never wins over an earlier one), pool[j] =
// max(m+bias[j], 0) and arg[j] = base+j plus m's offset: 0, c, row or
// row+c. It selects by conditional moves, not branches: on a network's
// activations which of the four wins is a coin toss a branch predictor
// loses.
func maxPool4Go(r0, r1, r2, r3, bias, pool []float32, arg []int32, base, c, row int32) {
	n := len(r0)
	r1, r2, r3, bias, pool, arg = r1[:n], r2[:n], r3[:n], bias[:n], pool[:n], arg[:n]
	for j, v0 := range r0 {
		best, at := v0, int32(0)
		best, at = pick(r1[j], best, c, at)
		best, at = pick(r2[j], best, row, at)
		best, at = pick(r3[j], best, row+c, at)
		pool[j] = max(best+bias[j], 0)
		arg[j] = base + at + int32(j)
	}
}

// pick is (v, vat) if v > best, else (best, bat), selected with masks
// rather than a branch.
func pick(v, best float32, vat, bat int32) (float32, int32) {
	m := ones(v > best)
	bv, bb := math.Float32bits(v), math.Float32bits(best)
	return math.Float32frombits(bb ^ (bb^bv)&m), bat ^ (bat^vat)&int32(m)
}

// MaxPoolRow is the CNN's 2x2 max pool, with its bias and ReLU, over a
// row of len(pool)/c windows of c channels (maxPool4Go for each):
// window i's four positions start at out[2*i*c], out[2*i*c+c],
// out[2*i*c+row] and out[2*i*c+row+c], its pooled values and positions
// go to pool[i*c:] and arg[i*c:], and its base is base+2*i*c. len(pool) must be a multiple of c, len(arg) equal to it,
// and out must hold row+2*len(pool) values.
func MaxPoolRow(out, bias, pool []float32, arg []int32, base, c, row int32) {
	w, n := windows(len(pool), len(arg), len(out), c, row)
	if w > 0 && c%8 == 0 && avx2Available() {
		maxPoolRowBulk(out[:n], bias[:c], pool, arg, w, base, c, row)
		return
	}
	for i := range w {
		o, p := 2*i*int(c), i*int(c)
		r0, r1, r2, r3 := window(out, o, int(c), int(row))
		maxPool4Go(r0, r1, r2, r3, bias[:c], pool[p:p+int(c)], arg[p:p+int(c)], base+int32(o), c, row)
	}
}

// UnpoolRow is MaxPoolRow's adjoint: for each of its windows, the
// gradient g = dPool[j] if the pool passed its ReLU (pool[j] > 0), else
// +0, goes to the window position arg[j] names (MaxPoolRow's), +0 to
// its other three, and is added into dBias[j%c] (the gradient of the
// bias the pool added), window after window. Every window position is
// written, so nothing needs clearing first. The lengths are
// MaxPoolRow's, dOut's as out's. Neither path branches on the values.
func UnpoolRow(dPool, pool []float32, arg []int32, dOut, dBias []float32, base, c, row int32) {
	w, n := windows(len(dPool), len(arg), len(dOut), c, row)
	pool = pool[:len(dPool)]
	if w > 0 && c%8 == 0 && avx2Available() {
		unpoolRowBulk(dPool, pool, arg, dOut[:n], dBias[:c], w, base, c, row)
		return
	}
	for i := range w {
		o, p := 2*i*int(c), i*int(c)
		d0, d1, d2, d3 := window(dOut, o, int(c), int(row))
		unpool4Go(dPool[p:p+int(c)], pool[p:p+int(c)], arg[p:p+int(c)], d0, d1, d2, d3, dBias[:c], base+int32(o), c, row)
	}
}

// window is the four positions of the pooling window at o of a map whose
// rows are row values long: top left, top right, bottom left, bottom
// right, c channels each.
func window(m []float32, o, c, row int) (r0, r1, r2, r3 []float32) {
	return m[o : o+c], m[o+c : o+2*c], m[o+row : o+row+c], m[o+row+c : o+row+2*c]
}

// windows checks a row of pooling windows' lengths (pooled values and
// positions, the map under them) and returns how many windows there are
// and how much of the map they cover.
func windows(pooled, args, mapped int, c, row int32) (w, n int) {
	if c <= 0 || pooled%int(c) != 0 || args != pooled || int(row) < 2*int(c) {
		panic("vec: a row of pooling windows of inconsistent lengths")
	}
	w = pooled / int(c)
	if w == 0 {
		return 0, 0
	}
	n = int(row) + 2*w*int(c)
	if mapped < n {
		panic("vec: a row of pooling windows past the end of the map")
	}
	return w, n
}

// unpool4Go is one window of UnpoolRow for the c = len(dPool) channels:
// d0..d3 are its positions, base its first's index.
func unpool4Go(dPool, pool []float32, arg []int32, d0, d1, d2, d3, dBias []float32, base, c, row int32) {
	n := len(dPool)
	pool, arg, d0, d1, d2, d3, dBias = pool[:n], arg[:n], d0[:n], d1[:n], d2[:n], d3[:n], dBias[:n]
	for j, g := range dPool {
		v := math.Float32bits(g) & ones(pool[j] > 0)
		dBias[j] += math.Float32frombits(v)
		o := arg[j] - base - int32(j)
		d0[j] = math.Float32frombits(v & ones(o == 0))
		d1[j] = math.Float32frombits(v & ones(o == c))
		d2[j] = math.Float32frombits(v & ones(o == row))
		d3[j] = math.Float32frombits(v & ones(o == row+c))
	}
}

// ones is all ones if b, else 0 (a conditional move, not a branch).
func ones(b bool) uint32 {
	var m uint32
	if b {
		m = ^uint32(0)
	}
	return m
}
