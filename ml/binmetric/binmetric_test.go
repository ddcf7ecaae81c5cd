package binmetric

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestAUCHandComputed(t *testing.T) {
	cases := []struct {
		name   string
		scores []float32
		labels []uint8
		want   float64
	}{
		// Pairs (pos, neg): (0.35, 0.1) right, (0.35, 0.4) wrong, 0.8 beats both: 3/4.
		{"distinct", []float32{0.1, 0.4, 0.35, 0.8}, []uint8{0, 0, 1, 1}, 0.75},
		// (0.5, 0.2) 1, (0.5, 0.5) a tie 1/2, (0.9, 0.2) 1, (0.9, 0.5) 1: 3.5/4.
		{"tie across classes", []float32{0.2, 0.5, 0.5, 0.9}, []uint8{0, 1, 0, 1}, 0.875},
		{"all tied", []float32{0.5, 0.5, 0.5, 0.5}, []uint8{0, 1, 0, 1}, 0.5},
		{"perfect", []float32{0.1, 0.2, 0.8, 0.9}, []uint8{0, 0, 1, 1}, 1},
		{"reversed", []float32{0.9, 0.8, 0.2, 0.1}, []uint8{0, 0, 1, 1}, 0},
	}
	for _, c := range cases {
		got, err := AUC(c.scores, c.labels)
		if err != nil || !near(got, c.want) {
			t.Errorf("%s: AUC = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}

// TestAUCMatchesPairs checks the sorted computation against counting
// every pair, on scores with many ties.
func TestAUCMatchesPairs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	scores := make([]float32, 300)
	labels := make([]uint8, len(scores))
	for i := range scores {
		scores[i] = float32(r.IntN(20)) / 20
		if r.Float64() < 0.3+0.4*float64(scores[i]) {
			labels[i] = 1
		}
	}
	var wins, pairs float64
	for i := range scores {
		for j := range scores {
			if labels[i] != 1 || labels[j] != 0 {
				continue
			}
			pairs++
			switch {
			case scores[i] > scores[j]:
				wins++
			case scores[i] == scores[j]:
				wins += 0.5
			}
		}
	}
	got, err := AUC(scores, labels)
	if err != nil || !near(got, wins/pairs) {
		t.Fatalf("AUC = %v, %v; counting pairs gives %v", got, err, wins/pairs)
	}
}

func TestAUCErrors(t *testing.T) {
	if _, err := AUC([]float32{0.1, 0.2}, []uint8{1, 1}); !errors.Is(err, ErrOneClass) {
		t.Errorf("one class: err = %v, want ErrOneClass", err)
	}
	if _, err := AUC([]float32{0.1}, []uint8{1, 0}); err == nil {
		t.Error("lengths differ: no error")
	}
}

func TestLogLossAndEntropy(t *testing.T) {
	ll, err := LogLoss([]float32{0.9, 0.2}, []uint8{1, 0})
	// -(ln 0.9 + ln 0.8) / 2
	if want := 0.16425205; err != nil || math.Abs(ll-want) > 1e-7 {
		t.Errorf("LogLoss = %v, %v; want %v", ll, err, want)
	}
	// A certain mistake is clamped, not infinite: -ln(1e-7).
	if ll, _ := LogLoss([]float32{0}, []uint8{1}); math.Abs(ll-16.118095651) > 1e-6 {
		t.Errorf("LogLoss of a certain mistake = %v, want -ln(Eps)", ll)
	}
	if h := Entropy(0.25); math.Abs(h-0.5623351446) > 1e-9 {
		t.Errorf("Entropy(0.25) = %v", h)
	}
	if h := Entropy(0.5); !near(h, math.Ln2) {
		t.Errorf("Entropy(0.5) = %v, want ln 2", h)
	}
	if ne := NormalizedEntropy(math.Ln2, 0.5); !near(ne, 1) {
		t.Errorf("NE of the base rate's own loss = %v, want 1", ne)
	}
	if !math.IsNaN(NormalizedEntropy(0.3, 0)) {
		t.Error("NE with a base rate of 0 is not NaN")
	}
}

// TestScoreBaseRateModel: predicting the base rate for every sample has
// AUC 1/2 and a normalized entropy of 1.
func TestScoreBaseRateModel(t *testing.T) {
	labels := []uint8{1, 0, 0, 0, 1, 0, 0, 0}
	probs := make([]float32, len(labels))
	for i := range probs {
		probs[i] = 0.25
	}
	s, err := Score(probs, labels)
	if err != nil {
		t.Fatal(err)
	}
	if !near(s.AUC, 0.5) || s.BaseRate != 0.25 || math.Abs(s.NormalizedEntropy-1) > 1e-6 {
		t.Errorf("Score = %+v; want AUC 0.5, base rate 0.25, NE 1", s)
	}
}
