package chief

import (
	"fmt"
	"math"

	"github.com/pstrain/pstrain/dataset"
	"github.com/pstrain/pstrain/model"
	"github.com/pstrain/pstrain/nn"
)

// Evaluator computes test accuracy and mean cross-entropy of a set of
// weights on a data set, in fixed-size batches (the last one padded and
// masked).
type Evaluator struct {
	net  *nn.Net
	test *dataset.Dataset
}

// NewEvaluator builds a forward-only net for spec.
func NewEvaluator(spec model.Spec, test *dataset.Dataset, batch int) (*Evaluator, error) {
	if test.N == 0 {
		return nil, fmt.Errorf("eval: empty test set")
	}
	n, err := nn.New(spec, min(batch, test.N), false)
	if err != nil {
		return nil, err
	}
	return &Evaluator{net: n, test: test}, nil
}

// Params are the buffers to write the weights into before Eval.
func (e *Evaluator) Params() [][]float32 { return e.net.Params() }

// Eval returns accuracy in [0,1] and mean loss over the whole test set.
func (e *Evaluator) Eval() (acc, loss float64, err error) {
	b, dim, classes := e.net.Batch(), e.test.Dim, e.net.Spec().Classes
	correct, total := 0, 0
	sumLoss := 0.0
	for start := 0; start < e.test.N; start += b {
		n := min(b, e.test.N-start)
		x := e.net.Input()
		copy(x, e.test.Images[start*dim:(start+n)*dim])
		clear(x[n*dim:])
		if _, err := e.net.Step(); err != nil {
			return 0, 0, err
		}
		logits := e.net.Logits()
		for i := 0; i < n; i++ {
			row := logits[i*classes : (i+1)*classes]
			best, mx := 0, row[0]
			for k, v := range row {
				if v > mx {
					best, mx = k, v
				}
			}
			lse := 0.0
			for _, v := range row {
				lse += math.Exp(float64(v - mx))
			}
			label := int(e.test.Labels[start+i])
			sumLoss += math.Log(lse) + float64(mx) - float64(row[label])
			if best == label {
				correct++
			}
			total++
		}
	}
	return float64(correct) / float64(total), sumLoss / float64(total), nil
}

// Close releases the net.
func (e *Evaluator) Close() error { return e.net.Close() }
