// Package optim holds the update rules a parameter-server shard applies to
// its flat parameter buffer. Each optimizer owns its state (velocity,
// Adam moments) for exactly the elements it updates, so the state is
// sharded with the parameters.
package optim

import (
	"fmt"
	"math"

	"github.com/pstrain/pstrain/ml/vec"
)

// Config selects an optimizer and its hyperparameters.
type Config struct {
	Name     string  `json:"name"` // sgd, momentum or adam
	LR       float64 `json:"lr"`
	Momentum float64 `json:"momentum"`
	Beta1    float64 `json:"beta1"`
	Beta2    float64 `json:"beta2"`
	Epsilon  float64 `json:"epsilon"`
}

// Optimizer applies gradients in place. Apply scales g by scale before use
// (a sync step passes 1/R to turn a sum into a mean) and may overwrite g.
type Optimizer interface {
	Apply(params, g []float32, scale float32)
	// ApplySum applies the gradient acc+g (scaled) and zeroes acc, in one
	// pass: a sync step's last gradient is added, applied and cleared
	// without the separate passes. The result is bit for bit that of
	// adding g into acc and calling Apply(params, acc, scale).
	ApplySum(params, acc, g []float32, scale float32)
	// State returns the optimizer state as one flat buffer (nil for SGD)
	// and the number of updates applied so far.
	State() ([]float32, int64)
	// SetState restores what State returned.
	SetState(state []float32, steps int64) error
	// SetLR sets the learning rate of the following updates (a shard
	// sets it from its schedule before each one). It allocates nothing;
	// setting Config.LR again changes nothing, bit for bit.
	SetLR(lr float64)
}

// New builds the optimizer for n parameters.
func New(c Config, n int) (Optimizer, error) {
	lr := float32(c.LR)
	switch c.Name {
	case "sgd":
		return &sgd{lr: lr}, nil
	case "momentum":
		return &momentum{lr: lr, mu: float32(c.Momentum), v: make([]float32, n)}, nil
	case "adam":
		b1, b2, eps := c.Beta1, c.Beta2, c.Epsilon
		if b1 == 0 {
			b1 = 0.9
		}
		if b2 == 0 {
			b2 = 0.999
		}
		if eps == 0 {
			eps = 1e-8
		}
		return &adam{lr: c.LR, b1: b1, b2: b2, eps: float32(eps), m: make([]float32, n), v: make([]float32, n)}, nil
	}
	return nil, fmt.Errorf("optim: unknown optimizer %q (want sgd, momentum or adam)", c.Name)
}

type sgd struct {
	lr    float32
	steps int64
}

func (o *sgd) Apply(p, g []float32, scale float32) {
	a := o.lr * scale
	p = p[:len(g)]
	for i, x := range g {
		p[i] -= a * x
	}
	o.steps++
}

func (o *sgd) ApplySum(p, acc, g []float32, scale float32) {
	a := o.lr * scale
	p, acc = p[:len(g)], acc[:len(g)]
	for i, x := range g {
		p[i] -= a * (acc[i] + x)
		acc[i] = 0
	}
	o.steps++
}

func (o *sgd) State() ([]float32, int64) { return nil, o.steps }

func (o *sgd) SetLR(lr float64) { o.lr = float32(lr) }

func (o *sgd) SetState(s []float32, steps int64) error {
	if len(s) != 0 {
		return fmt.Errorf("optim: sgd has no state, got %d values", len(s))
	}
	o.steps = steps
	return nil
}

// momentum is TensorFlow's MomentumOptimizer: v = mu*v + g; p -= lr*v.
type momentum struct {
	lr, mu float32
	v      []float32
	steps  int64
}

// Apply and ApplySum run package vec's loops: eight values an
// instruction with AVX2, the same results bit for bit as Go's loop.
func (o *momentum) Apply(p, g []float32, scale float32) {
	vec.Momentum(p, o.v, g, o.mu, o.lr, scale)
	o.steps++
}

func (o *momentum) ApplySum(p, acc, g []float32, scale float32) {
	vec.MomentumSum(p, o.v, acc, g, o.mu, o.lr, scale)
	o.steps++
}

func (o *momentum) State() ([]float32, int64) { return o.v, o.steps }

func (o *momentum) SetLR(lr float64) { o.lr = float32(lr) }

func (o *momentum) SetState(s []float32, steps int64) error {
	if len(s) != len(o.v) {
		return fmt.Errorf("optim: momentum state has %d values, want %d", len(s), len(o.v))
	}
	copy(o.v, s)
	o.steps = steps
	return nil
}

// adam is Kingma & Ba's Adam with bias correction folded into the step size.
type adam struct {
	lr, b1, b2 float64
	eps        float32
	m, v       []float32
	steps      int64
}

func (o *adam) Apply(p, g []float32, scale float32) {
	o.steps++
	t := float64(o.steps)
	alpha := float32(o.lr * math.Sqrt(1-math.Pow(o.b2, t)) / (1 - math.Pow(o.b1, t)))
	b1, b2, eps := float32(o.b1), float32(o.b2), o.eps
	m, v := o.m[:len(g)], o.v[:len(g)]
	p = p[:len(g)]
	for i, x := range g {
		x *= scale
		mi := b1*m[i] + (1-b1)*x
		vi := b2*v[i] + (1-b2)*x*x
		m[i], v[i] = mi, vi
		p[i] -= alpha * mi / (float32(math.Sqrt(float64(vi))) + eps)
	}
}

func (o *adam) ApplySum(p, acc, g []float32, scale float32) {
	o.steps++
	t := float64(o.steps)
	alpha := float32(o.lr * math.Sqrt(1-math.Pow(o.b2, t)) / (1 - math.Pow(o.b1, t)))
	b1, b2, eps := float32(o.b1), float32(o.b2), o.eps
	m, v := o.m[:len(g)], o.v[:len(g)]
	p, acc = p[:len(g)], acc[:len(g)]
	for i, x := range g {
		x = (acc[i] + x) * scale
		acc[i] = 0
		mi := b1*m[i] + (1-b1)*x
		vi := b2*v[i] + (1-b2)*x*x
		m[i], v[i] = mi, vi
		p[i] -= alpha * mi / (float32(math.Sqrt(float64(vi))) + eps)
	}
}

// SetLR sets the step size before bias correction, which stays a
// function of the number of updates.
func (o *adam) SetLR(lr float64) { o.lr = lr }

func (o *adam) State() ([]float32, int64) {
	s := make([]float32, 0, 2*len(o.m))
	return append(append(s, o.m...), o.v...), o.steps
}

func (o *adam) SetState(s []float32, steps int64) error {
	if len(s) != 2*len(o.m) {
		return fmt.Errorf("optim: adam state has %d values, want %d", len(s), 2*len(o.m))
	}
	copy(o.m, s[:len(o.m)])
	copy(o.v, s[len(o.m):])
	o.steps = steps
	return nil
}
