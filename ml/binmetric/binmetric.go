// Package binmetric scores the predictions of a binary classifier (a
// click-through-rate model): the area under the ROC curve, the log loss,
// and the normalized entropy (the log loss over the entropy of the base
// rate, so 1 is a model that knows nothing but the base rate). Labels are
// 0 or 1; predictions are probabilities of the label 1.
package binmetric

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrOneClass is returned by AUC for labels of one class only: the area
// is then undefined.
var ErrOneClass = errors.New("binmetric: AUC needs both labels among the samples")

// Eps bounds the probabilities LogLoss reads away from 0 and 1, so a
// confident mistake costs -log(Eps) (about 16.1) rather than infinity.
const Eps = 1e-7

func checkLen(scores []float32, labels []uint8) error {
	if len(scores) != len(labels) {
		return fmt.Errorf("binmetric: %d predictions for %d labels", len(scores), len(labels))
	}
	return nil
}

// AUC is the exact area under the ROC curve of scores against labels:
// the probability that a random positive scores above a random negative,
// a tie counting one half. It sorts the samples once (O(n log n)); tied
// scores share their mean rank.
func AUC(scores []float32, labels []uint8) (float64, error) {
	if err := checkLen(scores, labels); err != nil {
		return 0, err
	}
	order := make([]int32, len(scores))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int {
		sa, sb := scores[a], scores[b]
		switch {
		case sa < sb:
			return -1
		case sa > sb:
			return 1
		}
		return 0
	})
	var pos, neg int64
	var rankSum float64 // of the positives, ranks from 1
	for lo := 0; lo < len(order); {
		hi := lo + 1
		for hi < len(order) && scores[order[hi]] == scores[order[lo]] {
			hi++
		}
		mid := float64(lo+1+hi) / 2 // the mean of ranks lo+1..hi
		for _, i := range order[lo:hi] {
			if labels[i] != 0 {
				pos++
				rankSum += mid
			} else {
				neg++
			}
		}
		lo = hi
	}
	if pos == 0 || neg == 0 {
		return 0, ErrOneClass
	}
	return (rankSum - float64(pos)*float64(pos+1)/2) / (float64(pos) * float64(neg)), nil
}

// LogLoss is the mean of -(y log p + (1-y) log(1-p)) over the samples,
// p clamped to [Eps, 1-Eps]; 0 for no samples.
func LogLoss(probs []float32, labels []uint8) (float64, error) {
	if err := checkLen(probs, labels); err != nil {
		return 0, err
	}
	if len(probs) == 0 {
		return 0, nil
	}
	var sum float64
	for i, p := range probs {
		q := min(max(float64(p), Eps), 1-Eps)
		if labels[i] != 0 {
			sum -= math.Log(q)
		} else {
			sum -= math.Log(1 - q)
		}
	}
	return sum / float64(len(probs)), nil
}

// BaseRate is the fraction of labels that are 1; 0 for no labels.
func BaseRate(labels []uint8) float64 {
	if len(labels) == 0 {
		return 0
	}
	n := 0
	for _, y := range labels {
		if y != 0 {
			n++
		}
	}
	return float64(n) / float64(len(labels))
}

// Entropy is the entropy, in nats, of a coin that shows 1 with
// probability p: the log loss of always predicting p on labels whose
// rate is p. It is 0 at p = 0 or 1.
func Entropy(p float64) float64 {
	if p <= 0 || p >= 1 {
		return 0
	}
	return -(p*math.Log(p) + (1-p)*math.Log(1-p))
}

// NormalizedEntropy is logLoss over the entropy of the base rate p: below
// 1 a model does better than predicting the base rate for every sample.
// It is NaN when p is 0 or 1 (nothing to predict).
func NormalizedEntropy(logLoss, p float64) float64 {
	h := Entropy(p)
	if h == 0 {
		return math.NaN()
	}
	return logLoss / h
}

// Scores are the held-out metrics of a CTR model.
type Scores struct {
	AUC               float64 `json:"auc"`
	LogLoss           float64 `json:"logloss"`
	NormalizedEntropy float64 `json:"normalized_entropy"`
	BaseRate          float64 `json:"base_rate"`
}

// Score computes every metric of probs against labels.
func Score(probs []float32, labels []uint8) (Scores, error) {
	auc, err := AUC(probs, labels)
	if err != nil {
		return Scores{}, err
	}
	ll, err := LogLoss(probs, labels)
	if err != nil {
		return Scores{}, err
	}
	p := BaseRate(labels)
	return Scores{AUC: auc, LogLoss: ll, NormalizedEntropy: NormalizedEntropy(ll, p), BaseRate: p}, nil
}
