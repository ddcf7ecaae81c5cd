// Package nn runs the forward and backward pass of a model.Spec: an MLP
// as five matrix products written out (direct.go; gorgonia's graph of the
// same net is built beside it as the reference the tests compare with),
// a CNN as hand-written im2col convolutions; the products run on the BLAS
// package blas installed (float32 throughout).
// A Net is built once for a fixed batch size; each step the caller writes
// new weights into Params() in place, fills Input() and Labels(), calls
// Step, and reads the gradients from Grads(). Nothing is reallocated
// between steps.
package nn

import (
	"fmt"

	"github.com/pstrain/pstrain/ml/model"
)

// Net is one network, MLP or CNN, for a fixed batch size. It is not safe
// for concurrent use.
type Net struct {
	spec  model.Spec
	batch int
	impl  backend
}

// backend is one kind of network; Net's methods of the same names
// document them.
type backend interface {
	Params() [][]float32
	Input() []float32
	SetLabels(labels []uint8)
	Step() (float32, error)
	Grads() ([][]float32, error)
	Logits() []float32
	Close() error
}

// New builds the net for spec and batch. With train set, Step also
// computes gradients; otherwise only the forward pass (for evaluation).
func New(spec model.Spec, batch int, train bool) (*Net, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if spec.IsCTR() {
		return nil, fmt.Errorf("nn: a CTR model runs in package ctr (ctr.New), with its embedding tables")
	}
	if batch <= 0 {
		return nil, fmt.Errorf("nn: batch must be positive, got %d", batch)
	}
	var (
		impl backend
		err  error
	)
	if spec.IsCNN() {
		impl = newCNN(spec, batch, train)
	} else if impl, err = newMLP(spec, batch, train); err != nil {
		return nil, err
	}
	return &Net{spec: spec, batch: batch, impl: impl}, nil
}

// Batch is the fixed batch size.
func (n *Net) Batch() int { return n.batch }

// Spec is the model spec the net was built for.
func (n *Net) Spec() model.Spec { return n.spec }

// Params returns the weight buffers in model.Spec.Variables() order. Write
// new weights into them before Step; they are the net's own memory, and
// what it reads but for the pieces ReadFrom points elsewhere.
func (n *Net) Params() [][]float32 { return n.impl.Params() }

// Input is the [batch x input] buffer the next Step reads.
func (n *Net) Input() []float32 { return n.impl.Input() }

// SetLabels writes the one-hot targets for labels (len = batch).
func (n *Net) SetLabels(labels []uint8) { n.impl.SetLabels(labels) }

// Step runs the forward (and, for a training net, backward) pass and
// returns the mean loss over the batch.
func (n *Net) Step() (float32, error) { return n.impl.Step() }

// SetEarlyRows has each Step's backward pass announce parts of the
// gradient as they become final, for a worker to send them while the
// rest is computed (wait-free backpropagation, docs/scaling.md): the
// first layer's weight gradient is computed in row blocks split at rows
// (ascending, each within the input width), the last block first, and
// ready(r, loss) is called after each block but the one of row 0. At
// that call rows r and up of the first variable's gradient, and every
// other variable's, hold this step's values (Grads' slices); loss is
// the step's. ready runs on Step's goroutine and must not block for long.
// nil rows turns it off. It reports false, changing nothing, for rows
// out of order or range, and for nets whose pass does not support it
// (the CNN, the graph, a net without gradients).
func (n *Net) SetEarlyRows(rows []int, ready func(row int, loss float32)) bool {
	if e, ok := n.impl.(interface {
		setEarlyRows([]int, func(int, float32)) bool
	}); ok {
		return e.setEarlyRows(rows, ready)
	}
	return false
}

// ForwardRows computes, ahead of the next Step, the part of its forward
// pass that reads only Input() and rows r and up of the first weight
// variable, for a worker to start on the parameters of the shards that
// answered first while others have not (docs/scaling.md). r must be one
// of the rows SetEarlyRows split at; with early rows the forward pass's
// first product is computed in the same blocks, the last first, ahead or
// not, so Step's results do not depend on how much was done ahead. Step
// uses what ForwardRows computed: if Input() or those rows change before
// it, call Forget. It reports false, computing nothing, for any other r
// and for nets that do not split (see SetEarlyRows).
func (n *Net) ForwardRows(r int) bool {
	if a, ok := n.impl.(interface{ forwardRows(int) bool }); ok {
		return a.forwardRows(r)
	}
	return false
}

// Forget drops what ForwardRows computed: the next Step computes its
// forward pass in full.
func (n *Net) Forget() {
	if a, ok := n.impl.(interface{ forget() }); ok {
		a.forget()
	}
}

// ReadFrom has the next Steps read a piece of the parameters from data
// instead of Params(), until ReadFrom(v, row, nil) or Own: a worker
// reads them where its pull left them (a region it shares with the
// parameter server) instead of copying them into Params(). The pieces
// are every variable but the first, whole (row 0), and the first
// variable's blocks of rows split at the early rows (SetEarlyRows): a
// piece that starts at row. data must hold the piece's values and not
// change while a Step or ForwardRows reads it. It reports false,
// changing nothing, for anything else, and for nets that read only
// Params() (the CNN, the graph).
func (n *Net) ReadFrom(v, row int, data []float32) bool {
	if r, ok := n.impl.(interface {
		readFrom(int, int, []float32) bool
	}); ok {
		return r.readFrom(v, row, data)
	}
	return false
}

// Own copies every piece read from elsewhere (ReadFrom) into Params()
// and has the net read it from there again.
func (n *Net) Own() {
	if r, ok := n.impl.(interface{ own() }); ok {
		r.own()
	}
}

// Grads returns the gradients computed by the last Step, in variable order.
// The slices belong to the net and are overwritten by the next Step.
func (n *Net) Grads() ([][]float32, error) { return n.impl.Grads() }

// Logits returns the output of the last Step ([batch x classes]).
func (n *Net) Logits() []float32 { return n.impl.Logits() }

// Close releases what the net holds.
func (n *Net) Close() error { return n.impl.Close() }
