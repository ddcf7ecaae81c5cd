package ps

import "github.com/pstrain/pstrain/ml/vec"

// Agreement is a shard's half of attribution (docs/security.md,
// "Attribution"): over a window of versions it sums each worker's
// accepted gradients, and when the window closes (at the chief's
// evaluation pull) it measures how each worker's sum lines up with the
// change of the shard's parameters over the window. The chief adds the
// shards' figures up into cosines over the whole model and weighs them
// against what its evaluations say of that change: a worker whose
// gradients point along a change that made the model worse, or against
// one that made it better, is the one pulling the wrong way. It is a
// plain value with no clock or I/O; the Shard feeds it.
type Agreement struct {
	sums [][]float32 // by worker: accepted gradients' sum (nil: none this window)
	mark []float32   // the parameters when the window began
	from int64       // the version the window began at
}

// Window is a closed window's figures over the shard's slice.
type Window struct {
	From, To int64
	// Dot[w] is worker w's gradient sum dotted with the descent the
	// parameters made (their value at From minus their value at To):
	// positive when the model moved the way w's gradients point. Sq[w]
	// is that sum's squared norm (0: no gradient of w this window).
	Dot, Sq []float64
	// UpdateSq is the squared norm of the parameters' change.
	UpdateSq float64
}

// NewAgreement starts a window at version, params being the shard's
// parameters then (copied).
func NewAgreement(params []float32, version int64) *Agreement {
	return &Agreement{mark: append([]float32(nil), params...), from: version}
}

// Add counts worker's accepted gradient g into the window.
func (a *Agreement) Add(worker int, g []float32) {
	if len(g) != len(a.mark) {
		return
	}
	if sum := a.Sum(worker); sum != nil {
		vec.Add(sum, g)
	}
}

// Sum is where worker's accepted gradients are summed this window, for
// a caller that adds one in while it reads it for something else (the
// shard's update: optim.Step); nil for a negative worker.
func (a *Agreement) Sum(worker int) []float32 {
	if worker < 0 {
		return nil
	}
	for len(a.sums) <= worker {
		a.sums = append(a.sums, nil)
	}
	if a.sums[worker] == nil {
		a.sums[worker] = make([]float32, len(a.mark))
	}
	return a.sums[worker]
}

// Close ends the window at version with the shard's parameters params,
// returns its figures for workers workers (at least), and starts the
// next window there.
func (a *Agreement) Close(params []float32, version int64, workers int) Window {
	n := max(workers, len(a.sums))
	w := Window{From: a.from, To: version, Dot: make([]float64, n), Sq: make([]float64, n)}
	if len(params) == len(a.mark) {
		for i, p := range params {
			d := float64(a.mark[i] - p)
			w.UpdateSq += d * d
		}
		for k, s := range a.sums {
			if s == nil {
				continue
			}
			var dot, sq float64
			for i, v := range s {
				dot += float64(v) * float64(a.mark[i]-params[i])
				sq += float64(v) * float64(v)
			}
			w.Dot[k], w.Sq[k] = dot, sq
		}
	}
	a.mark = append(a.mark[:0], params...)
	a.from = version
	for k := range a.sums {
		a.sums[k] = nil
	}
	return w
}
