package chief

import "testing"

// TestEvalPaceSpreadsAConfirmation: a wait pays for at most two routine
// evaluations' samples; what a whole-set confirmation cost beyond that
// is paid by the waits after it, every sample once.
func TestEvalPaceSpreadsAConfirmation(t *testing.T) {
	var p evalPace
	scored, paid := 0, 0
	for i, c := range []struct {
		scored int
		whole  bool
		charge int
	}{
		{250, false, 250},   // far from the target: a quarter subset
		{1000, false, 1000}, // in sight: a routine subset
		{10000, true, 2000}, // a confirmation that failed: 8,000 owed
		{1000, false, 2000}, // 7,000 owed
		{1000, false, 2000}, // 6,000
		{0, false, 2000},    // an evaluation that failed scored nothing: 4,000
		{1000, false, 2000}, // 3,000
		{1000, false, 2000}, // 2,000
		{1000, false, 2000}, // 1,000
		{1000, false, 2000}, // paid
		{1000, false, 1000}, // routine again
	} {
		p.ended(c.scored, c.whole)
		if p.charge != c.charge {
			t.Fatalf("evaluation %d (%d scored, whole %v): the wait pays for %d, want %d (owed %d)", i, c.scored, c.whole, p.charge, c.charge, p.debt)
		}
		scored, paid = scored+c.scored, paid+p.charge
	}
	if paid != scored || p.debt != 0 {
		t.Fatalf("the waits paid for %d samples of %d scored, %d owed", paid, scored, p.debt)
	}
	// With no routine evaluation before it (every one scores the whole
	// set: a CTR model, or a hold of one), a wait pays for all of one.
	var q evalPace
	q.ended(10000, true)
	if q.charge != 10000 || q.debt != 0 {
		t.Fatalf("a first whole evaluation: the wait pays for %d, %d owed; want 10000, 0", q.charge, q.debt)
	}
}
