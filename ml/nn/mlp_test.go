package nn

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pstrain/pstrain/ml/model"
)

// lossAt evaluates the loss with the net's current parameters.
func lossAt(t *testing.T, n *Net) float64 {
	t.Helper()
	l, err := n.Step()
	if err != nil {
		t.Fatal(err)
	}
	return float64(l)
}

// TestGradientsMatchFiniteDifferences checks gorgonia's backward pass
// against central differences on a small net, for every variable.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	spec := model.Spec{Input: 6, Hidden: []int{5, 4}, Classes: 3}
	const batch = 4
	n, err := New(spec, batch, true)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	r := rand.New(rand.NewPCG(1, 2))
	for i, w := range spec.Init(3) {
		copy(n.Params()[i], w)
		for j := range n.Params()[i] {
			n.Params()[i][j] += float32(r.NormFloat64() * 0.1) // non-zero biases too
		}
	}
	for i := range n.Input() {
		n.Input()[i] = float32(r.Float64())
	}
	n.SetLabels([]uint8{0, 2, 1, 2})
	lossAt(t, n)
	gs, err := n.Grads()
	if err != nil {
		t.Fatal(err)
	}
	analytic := make([][]float32, len(gs))
	for i := range gs {
		analytic[i] = append([]float32(nil), gs[i]...)
	}
	const h = 1e-2
	for vi, p := range n.Params() {
		for j := range p {
			orig := p[j]
			p[j] = orig + h
			up := lossAt(t, n)
			p[j] = orig - h
			down := lossAt(t, n)
			p[j] = orig
			num := (up - down) / (2 * h)
			if d := math.Abs(num - float64(analytic[vi][j])); d > 2e-3+0.02*math.Abs(num) {
				t.Fatalf("var %d elem %d: analytic %v, numeric %v", vi, j, analytic[vi][j], num)
			}
		}
	}
}

func TestForwardOnlyNetRefusesGrads(t *testing.T) {
	n, err := New(model.Spec{Input: 3, Classes: 2}, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Step(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Grads(); err == nil {
		t.Fatal("Grads on an eval net should fail")
	}
	if got := len(n.Logits()); got != 4 {
		t.Fatalf("logits len %d, want 4", got)
	}
}

func TestNewRefusesCTR(t *testing.T) {
	spec := model.Spec{Kind: model.KindCTR, Input: 13, Fields: 26, EmbeddingDim: 16, Hidden: []int{8}, Classes: 1}
	if _, err := New(spec, 4, true); err == nil {
		t.Error("nn built a CTR model as an MLP")
	}
}
