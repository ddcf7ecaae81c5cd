package optim

import (
	"math"
	"strings"
	"testing"
)

func TestParseSchedule(t *testing.T) {
	for in, want := range map[string]Schedule{
		"":             {},
		"constant":     {},
		"cosine":       {Kind: Cosine},
		"step:1:0.5":   {Kind: StepDecay, Epochs: 1, Factor: 0.5},
		"step:2.5:0.3": {Kind: StepDecay, Epochs: 2.5, Factor: 0.3},
		"step:3:1":     {Kind: StepDecay, Epochs: 3, Factor: 1},
	} {
		got, err := ParseSchedule(in)
		if err != nil || got != want {
			t.Errorf("ParseSchedule(%q) = %+v, %v; want %+v", in, got, err, want)
			continue
		}
		if back, err := ParseSchedule(got.String()); err != nil || back != got {
			t.Errorf("%q: String %q does not read back: %+v, %v", in, got.String(), back, err)
		}
	}
	for in, want := range map[string]string{
		"linear":       "want constant, step:EPOCHS:FACTOR",
		"step":         "want constant, step:EPOCHS:FACTOR",
		"step:2":       "want step:EPOCHS:FACTOR",
		"step:x:0.5":   `EPOCHS must be a positive number, got "x"`,
		"step:0:0.5":   "EPOCHS must be a positive number",
		"step:-1:0.5":  "EPOCHS must be a positive number",
		"step:Inf:0.5": "EPOCHS must be a positive number",
		"step:1:0":     "FACTOR must be in (0, 1]",
		"step:1:1.5":   "FACTOR must be in (0, 1]",
		"step:1:NaN":   "FACTOR must be in (0, 1]",
		"step:1:0.5:2": "FACTOR must be in (0, 1]",
		"Cosine":       "want constant",
	} {
		_, err := ParseSchedule(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), `"`+in+`"`) {
			t.Errorf("ParseSchedule(%q) = %v, want an error containing %q", in, err, want)
		}
	}
}

func TestLRScheduleAt(t *testing.T) {
	must := func(l LRSchedule, err error) LRSchedule {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	step, _ := ParseSchedule("step:2:0.5")
	constant := must(NewLRSchedule(0.2, Schedule{}, 0, 100, 1000))
	stepped := must(NewLRSchedule(0.2, step, 0, 100, 1000)) // halve every 200 versions
	fracStep := must(NewLRSchedule(1, step, 0, 234.375, 0)) // 2 epochs = 468.75 versions
	cosine := must(NewLRSchedule(0.2, Schedule{Kind: Cosine}, 0, 0, 1000))
	warm := must(NewLRSchedule(0.2, Schedule{}, 10, 0, 0))
	warmCos := must(NewLRSchedule(0.2, Schedule{Kind: Cosine}, 4, 0, 1000))
	for _, c := range []struct {
		name string
		l    LRSchedule
		v    int64
		want float64
	}{
		{"constant", constant, 0, 0.2},
		{"constant", constant, 999, 0.2},
		{"constant", constant, 5000, 0.2},
		{"step", stepped, 0, 0.2},
		{"step", stepped, 199, 0.2},
		{"step", stepped, 200, 0.1},
		{"step", stepped, 399, 0.1},
		{"step", stepped, 400, 0.05},
		{"step", stepped, 999, 0.2 / 16},
		{"step fractional epoch", fracStep, 468, 1},
		{"step fractional epoch", fracStep, 469, 0.5},
		{"step fractional epoch", fracStep, 937, 0.5},
		{"step fractional epoch", fracStep, 938, 0.25},
		{"cosine", cosine, 0, 0.2},
		{"cosine", cosine, 250, 0.1 * (1 + math.Sqrt2/2)},
		{"cosine", cosine, 500, 0.1},
		{"cosine", cosine, 750, 0.1 * (1 - math.Sqrt2/2)},
		{"cosine", cosine, 1000, 0},
		{"cosine past the end", cosine, 1200, 0},
		{"warmup", warm, 0, 0.02},
		{"warmup", warm, 4, 0.1},
		{"warmup", warm, 9, 0.2},
		{"warmup", warm, 10, 0.2},
		{"warmup", warm, 100000, 0.2},
		{"warmup x cosine", warmCos, 1, 0.2 * 0.5 * (1 + math.Cos(math.Pi/1000)) * 0.5},
		{"warmup x cosine", warmCos, 500, 0.1},
	} {
		if got := c.l.At(c.v); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: lr at version %d = %v, want %v", c.name, c.v, got, c.want)
		}
	}
	// Constant without warmup is the base rate exactly: runs without a
	// schedule train bit for bit as before schedules existed.
	for _, v := range []int64{0, 1, 7, 1 << 40} {
		if constant.At(v) != 0.2 {
			t.Fatalf("constant at %d = %v, not exactly 0.2", v, constant.At(v))
		}
	}
	// Cosine decreases monotonically.
	prev := math.Inf(1)
	for v := int64(0); v <= 1000; v++ {
		lr := cosine.At(v)
		if lr > prev {
			t.Fatalf("cosine rises at %d: %v after %v", v, lr, prev)
		}
		prev = lr
	}
}

func TestNewLRScheduleErrors(t *testing.T) {
	step, _ := ParseSchedule("step:1:0.5")
	for _, c := range []struct {
		name          string
		base          float64
		s             Schedule
		warmup        int64
		stepsPerEpoch float64
		maxVersion    int64
		want          string
	}{
		{"step without epochs", 0.1, step, 0, 0, 100, "needs the number of steps per epoch"},
		{"step with NaN epochs", 0.1, step, 0, math.NaN(), 100, "needs the number of steps per epoch"},
		{"cosine without end", 0.1, Schedule{Kind: Cosine}, 0, 10, 0, "needs the run's last step"},
		{"no rate", 0, Schedule{}, 0, 10, 100, "learning rate must be positive"},
		{"negative warmup", 0.1, Schedule{}, -1, 10, 100, "warmup steps must be >= 0"},
	} {
		_, err := NewLRSchedule(c.base, c.s, c.warmup, c.stepsPerEpoch, c.maxVersion)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
	// A constant schedule needs neither.
	if _, err := NewLRSchedule(0.1, Schedule{}, 5, 0, 0); err != nil {
		t.Error(err)
	}
}

// Setting the configured rate again changes nothing, and SetLR changes the
// next update's rate.
func TestSetLR(t *testing.T) {
	for _, name := range []string{"sgd", "momentum", "adam"} {
		c := Config{Name: name, LR: 0.05, Momentum: 0.9}
		a, _ := New(c, 3)
		b, _ := New(c, 3)
		pa, pb := []float32{1, 2, 3}, []float32{1, 2, 3}
		for range 4 {
			g := []float32{0.3, -0.1, 0.7}
			a.Apply(pa, append([]float32(nil), g...), 0.5)
			b.SetLR(c.LR)
			b.Apply(pb, g, 0.5)
		}
		for i := range pa {
			if pa[i] != pb[i] {
				t.Fatalf("%s: SetLR(LR) changed the update: %v vs %v", name, pa, pb)
			}
		}
	}
	o, _ := New(Config{Name: "sgd", LR: 1}, 1)
	p := []float32{1}
	o.SetLR(0.25)
	o.Apply(p, []float32{2}, 1)
	if p[0] != 0.5 {
		t.Fatalf("sgd at lr 0.25: p = %v, want 0.5", p[0])
	}
	m, _ := New(Config{Name: "momentum", LR: 1, Momentum: 0.5}, 1)
	p = []float32{1}
	m.Apply(p, []float32{1}, 1) // v=1, p=0
	m.SetLR(0.1)
	m.Apply(p, []float32{1}, 1) // v=1.5, p=-0.15
	if math.Abs(float64(p[0])+0.15) > 1e-7 {
		t.Fatalf("momentum after SetLR: p = %v, want -0.15", p[0])
	}
}

func TestSetLRAllocatesNothing(t *testing.T) {
	for _, name := range []string{"sgd", "momentum", "adam"} {
		o, _ := New(Config{Name: name, LR: 0.05, Momentum: 0.9}, 64)
		p, acc, g := make([]float32, 64), make([]float32, 64), make([]float32, 64)
		l, _ := NewLRSchedule(0.05, Schedule{Kind: Cosine}, 10, 0, 1000)
		v := int64(0)
		if n := testing.AllocsPerRun(100, func() {
			o.SetLR(l.At(v))
			o.ApplySum(p, acc, g, 0.5)
			v++
		}); n != 0 {
			t.Errorf("%s: %v allocations per scheduled update", name, n)
		}
	}
}
