package chief

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/model"
)

// A confirmation that completes a subset's score with the rest of the
// set gives the whole set's accuracy and loss, scoring only the rest.
func TestEvaluatorCompleteIsWholeSet(t *testing.T) {
	const n, dim, classes = 997, 6, 4
	rng := rand.New(rand.NewPCG(3, 4))
	test := &dataset.Dataset{Images: make([]float32, n*dim), Labels: make([]uint8, n), N: n, Dim: dim, Classes: classes}
	for i := range test.Images {
		test.Images[i] = rng.Float32()
	}
	for i := range test.Labels {
		test.Labels[i] = uint8(rng.IntN(classes))
	}
	spec := model.Spec{Input: dim, Hidden: []int{5}, Classes: classes}
	ev, err := NewEvaluator(spec, test, 100, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	for _, p := range ev.Params() {
		for i := range p {
			p[i] = float32(rng.NormFloat64())
		}
	}
	acc, loss, all, err := ev.Score(1)
	if err != nil || all != n {
		t.Fatalf("whole set: %d samples, %v", all, err)
	}
	// Window 0 (Score and Complete) and later windows (an evaluation's
	// sequence number) alike.
	var subLosses []float64
	for k := range 3 {
		subAcc, subLoss, m, err := ev.ScoreAt(0.2, k)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			if a, l, m0, _ := ev.Score(0.2); a != subAcc || l != subLoss || m0 != m {
				t.Errorf("ScoreAt(0.2, 0) %v %v %d, Score(0.2) %v %v %d", subAcc, subLoss, m, a, l, m0)
			}
		}
		gotAcc, gotLoss, total, scored, err := ev.CompleteAt(0.2, k, subAcc, subLoss, m)
		if err != nil {
			t.Fatal(err)
		}
		if total != n || scored != n-m || math.Abs(gotAcc-acc) > 1e-12 || math.Abs(gotLoss-loss) > 1e-6 {
			t.Errorf("window %d completed: acc %v loss %v over %d (scored %d), want %v %v over %d (scored %d)", k, gotAcc, gotLoss, total, scored, acc, loss, n, n-m)
		}
		if subAcc == acc && subLoss == loss {
			t.Errorf("window %d scored exactly the whole set: the case tells nothing", k)
		}
		subLosses = append(subLosses, subLoss)
	}
	if subLosses[0] == subLosses[1] && subLosses[1] == subLosses[2] {
		t.Error("three windows scored the same loss: the same images")
	}
}
