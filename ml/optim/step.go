package optim

import "github.com/pstrain/pstrain/ml/vec"

// Step is a parameter server's whole update by one gradient: g added
// into sum (the shard's attribution sum of g's worker; nil: none), then
// o.Apply(params, g, scale), then the updated parameters copied into
// out (the shard's next pull snapshot; nil: none). The momentum
// optimizer, given a sum, does all three in one pass over the memory
// (vec.MomentumStep); the others, and momentum without a sum (a trimmed
// mean, a refused gradient), in turn. Either way the results are bit for
// bit those of the separate calls.
func Step(o Optimizer, params, g []float32, scale float32, sum, out []float32) {
	if m, ok := o.(*momentum); ok && sum != nil {
		vec.MomentumStep(params, m.v, g, sum, orParams(out, params), m.mu, m.lr, scale)
		m.steps++
		return
	}
	if sum != nil {
		vec.Add(sum, g) // (first: Apply may overwrite g)
	}
	o.Apply(params, g, scale)
	copyOut(out, params)
}

// StepSum is Step by the gradient acc+g, acc zeroed (o.ApplySum): a
// sync step's last gradient g, the sum of the step's others in acc.
// Only g is added into sum.
func StepSum(o Optimizer, params, acc, g []float32, scale float32, sum, out []float32) {
	if m, ok := o.(*momentum); ok && sum != nil {
		vec.MomentumSumStep(params, m.v, acc, g, sum, orParams(out, params), m.mu, m.lr, scale)
		m.steps++
		return
	}
	if sum != nil {
		vec.Add(sum, g)
	}
	o.ApplySum(params, acc, g, scale)
	copyOut(out, params)
}

// orParams is out, or params when there is no out (the fused kernels
// then store each parameter once more where it already is).
func orParams(out, params []float32) []float32 {
	if out == nil {
		return params
	}
	return out
}

func copyOut(out, params []float32) {
	if out != nil {
		copy(out, params)
	}
}
