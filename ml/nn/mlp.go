package nn

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/pstrain/pstrain/ml/model"
)

// mlpNet is one compiled gorgonia MLP graph for a fixed batch size.
type mlpNet struct {
	spec    model.Spec
	batch   int
	train   bool
	g       *G.ExprGraph
	x, y    *G.Node
	vars    []*G.Node
	grads   G.Nodes
	loss    *G.Node
	logits  *G.Node
	vm      G.VM
	params  [][]float32 // backing arrays of vars
	xData   []float32
	yData   []float32
	lossVal G.Value
	outVal  G.Value
	direct  *direct // the pass Step runs (direct.go); nil: the graph's
}

// newMLP builds the net for a valid MLP spec and a positive batch: Step
// runs the written-out pass (direct.go) over the graph's buffers.
func newMLP(spec model.Spec, batch int, train bool) (*mlpNet, error) {
	n, err := newMLPGraph(spec, batch, train)
	if err != nil {
		return nil, err
	}
	n.direct = newDirect(spec, batch, train, n.xData, n.yData, n.params)
	return n, nil
}

// newGraph is New for an MLP running gorgonia's graph instead of the
// written-out pass: the reference the tests compare with.
func newGraph(spec model.Spec, batch int, train bool) (*Net, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if batch <= 0 || spec.IsCNN() {
		return nil, fmt.Errorf("nn: newGraph needs an MLP spec and a positive batch")
	}
	impl, err := newMLPGraph(spec, batch, train)
	if err != nil {
		return nil, err
	}
	return &Net{spec: spec, batch: batch, impl: impl}, nil
}

// newMLPGraph builds gorgonia's graph of the MLP.
func newMLPGraph(spec model.Spec, batch int, train bool) (*mlpNet, error) {
	n := &mlpNet{spec: spec, batch: batch, train: train, g: G.NewGraph()}
	n.xData = make([]float32, batch*spec.Input)
	n.yData = make([]float32, batch*spec.Classes)
	xT := tensor.New(tensor.WithShape(batch, spec.Input), tensor.WithBacking(n.xData))
	yT := tensor.New(tensor.WithShape(batch, spec.Classes), tensor.WithBacking(n.yData))
	n.x = G.NewMatrix(n.g, tensor.Float32, G.WithShape(batch, spec.Input), G.WithName("x"), G.WithValue(xT))
	n.y = G.NewMatrix(n.g, tensor.Float32, G.WithShape(batch, spec.Classes), G.WithName("y"), G.WithValue(yT))

	h := n.x
	vs := spec.Variables()
	for i := 0; i < len(vs); i += 2 {
		wv, bv := vs[i], vs[i+1]
		wData := make([]float32, wv.Size())
		bData := make([]float32, bv.Size())
		w := G.NewMatrix(n.g, tensor.Float32, G.WithShape(wv.Rows, wv.Cols), G.WithName(wv.Name),
			G.WithValue(tensor.New(tensor.WithShape(wv.Rows, wv.Cols), tensor.WithBacking(wData))))
		b := G.NewMatrix(n.g, tensor.Float32, G.WithShape(1, bv.Cols), G.WithName(bv.Name),
			G.WithValue(tensor.New(tensor.WithShape(1, bv.Cols), tensor.WithBacking(bData))))
		n.vars = append(n.vars, w, b)
		n.params = append(n.params, wData, bData)
		var err error
		if h, err = G.Mul(h, w); err != nil {
			return nil, fmt.Errorf("nn: layer %d matmul: %w", i/2, err)
		}
		if h, err = G.BroadcastAdd(h, b, nil, []byte{0}); err != nil {
			return nil, fmt.Errorf("nn: layer %d bias: %w", i/2, err)
		}
		if i+2 < len(vs) {
			if h, err = G.Rectify(h); err != nil {
				return nil, fmt.Errorf("nn: layer %d relu: %w", i/2, err)
			}
		}
	}
	n.logits = h
	roots := []*G.Node{G.Read(n.logits, &n.outVal)}

	// Softmax cross-entropy: mean over the batch of -sum(y * logsoftmax(z)).
	logp, err := G.LogSoftMax(h)
	if err != nil {
		return nil, fmt.Errorf("nn: logsoftmax: %w", err)
	}
	prod, err := G.HadamardProd(logp, n.y)
	if err != nil {
		return nil, fmt.Errorf("nn: xent: %w", err)
	}
	sum, err := G.Sum(prod)
	if err != nil {
		return nil, fmt.Errorf("nn: xent sum: %w", err)
	}
	scale := G.NewConstant(float32(-1.0 / float64(batch)))
	if n.loss, err = G.Mul(sum, scale); err != nil {
		return nil, fmt.Errorf("nn: xent scale: %w", err)
	}
	roots = append(roots, G.Read(n.loss, &n.lossVal))
	if train {
		if n.grads, err = G.Grad(n.loss, n.vars...); err != nil {
			return nil, fmt.Errorf("nn: gradients: %w", err)
		}
		roots = append(roots, n.grads...)
	}
	// Symbolic differentiation also builds the gradient of the input
	// images (dX = dZ1 * W1^T: as many FLOPs as the first layer's forward
	// product), which nothing reads. The machine runs only what the
	// outputs, the loss and the variables' gradients need.
	n.vm = G.NewTapeMachine(n.g.ExactSubgraphRoots(roots...))
	return n, nil
}

func (n *mlpNet) Params() [][]float32 { return n.params }

func (n *mlpNet) Input() []float32 { return n.xData }

func (n *mlpNet) SetLabels(labels []uint8) {
	clear(n.yData)
	for i, l := range labels {
		n.yData[i*n.spec.Classes+int(l)] = 1
	}
}

func (n *mlpNet) Step() (float32, error) {
	if n.direct != nil {
		return n.direct.step(), nil
	}
	defer n.vm.Reset()
	if err := n.vm.RunAll(); err != nil {
		return 0, fmt.Errorf("nn: run: %w", err)
	}
	return n.lossVal.Data().(float32), nil
}

func (n *mlpNet) setEarlyRows(rows []int, ready func(int, float32)) bool {
	return n.direct != nil && n.direct.setEarlyRows(rows, ready)
}

func (n *mlpNet) forwardRows(r int) bool { return n.direct != nil && n.direct.forwardRows(r) }

func (n *mlpNet) forget() {
	if n.direct != nil {
		n.direct.forget()
	}
}

func (n *mlpNet) readFrom(v, row int, data []float32) bool {
	return n.direct != nil && n.direct.readFrom(v, row, data)
}

func (n *mlpNet) own() {
	if n.direct != nil {
		n.direct.own()
	}
}

func (n *mlpNet) Grads() ([][]float32, error) {
	if !n.train {
		return nil, fmt.Errorf("nn: net was built without gradients")
	}
	if n.direct != nil {
		return n.direct.grads, nil
	}
	out := make([][]float32, len(n.grads))
	for i, g := range n.grads {
		v := g.Value()
		if v == nil {
			return nil, fmt.Errorf("nn: gradient %d not computed", i)
		}
		out[i] = v.Data().([]float32)
	}
	return out, nil
}

func (n *mlpNet) Logits() []float32 {
	if n.direct != nil {
		return n.direct.logits()
	}
	return n.outVal.Data().([]float32)
}

func (n *mlpNet) Close() error { return n.vm.Close() }
