package chief

import (
	"math"
	"testing"
)

func TestAgreementsAndSingledOut(t *testing.T) {
	cos := func(c ...float64) Window {
		w := Window{UpdateSq: 4}
		for _, x := range c {
			w.Dot, w.Sq = append(w.Dot, 2*x), append(w.Sq, 1) // |sum| 1, |descent| 2
		}
		return w
	}
	none := func(int) bool { return false }
	for _, c := range []struct {
		name          string
		w             Window
		before, after float64
		want          int
	}{
		{"two workers, a flipper makes the model worse", cos(-0.9, 0.95), 1.2, 9e4, 1},
		{"two workers, the loss not finite", cos(-0.9, 0.95), 1.2, math.Inf(1), 1},
		{"two honest workers, the model better", cos(0.7, 0.7), 2.3, 1.2, -1},
		{"two honest workers, honest noise up", cos(0.7, 0.7), 0.30, 0.31, -1},
		{"three workers, the trimmed mean holds", cos(0.8, 0.75, -0.6), 0.8, 0.7, 2},
		{"three workers, a second one undecided", cos(0.8, 0.1, -0.6), 0.8, 0.7, -1},
		{"three workers, two against", cos(0.8, -0.5, -0.6), 0.8, 0.7, -1},
		{"three workers, converged: the flipper's gradients are noise to the descent", cos(0.3, 0.26, -0.05), 0.30, 0.29, 2},
		{"three honest workers, converged", cos(0.3, 0.26, 0.21), 0.30, 0.29, -1},
		{"a worker without gradients does not count", Window{Dot: []float64{1.8, 0, -1.2}, Sq: []float64{1, 0, 1}, UpdateSq: 4}, 0.8, 0.7, 2},
		{"a lone worker against nobody", Window{Dot: []float64{0, -1.2}, Sq: []float64{0, 1}, UpdateSq: 4}, 0.8, 0.7, -1},
		{"the loss at the start unknown", cos(0.8, -0.6), math.NaN(), 0.7, -1},
		{"the model did not move", Window{Dot: []float64{0, 0}, Sq: []float64{1, 1}}, 0.8, 0.7, -1},
	} {
		a := Agreements(c.w, c.before, c.after)
		if got := singledOut(a, none); got != c.want {
			t.Errorf("%s: agreements %v single out %d, want %d", c.name, a, got, c.want)
		}
	}
	// A quarantined worker is left out: the others decide.
	a := Agreements(cos(0.8, -0.9, -0.6), 0.8, 0.7)
	if got := singledOut(a, func(w int) bool { return w == 1 }); got != 2 {
		t.Errorf("with worker 1 quarantined: %d, want 2", got)
	}
}
