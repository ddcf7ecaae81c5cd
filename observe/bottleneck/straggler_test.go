package bottleneck

import (
	"math"
	"strings"
	"testing"
	"time"
)

// workers builds WorkerTimes from own seconds per step, 100 steps each.
func workers(perStep ...float64) []WorkerTime {
	var out []WorkerTime
	for i, p := range perStep {
		out = append(out, WorkerTime{Task: "worker/" + string(rune('0'+i)), Steps: 100, OwnSeconds: 100 * p})
	}
	return out
}

func TestFindStragglers(t *testing.T) {
	cases := []struct {
		name string
		in   []WorkerTime
		want map[string]float64 // task -> slowdown
	}{
		{name: "one slowed 3x of two", in: workers(0.012, 0.036), want: map[string]float64{"worker/1": 3}},
		{name: "one slowed 3x of four", in: workers(0.012, 0.013, 0.039, 0.011), want: map[string]float64{"worker/2": 3.25}},
		// The median of the others: one straggler does not hide another.
		{name: "two slowed of five", in: workers(0.01, 0.03, 0.01, 0.02, 0.01), want: map[string]float64{"worker/1": 3, "worker/3": 2}},
		{name: "two slowed of four", in: workers(0.01, 0.03, 0.01, 0.03), want: map[string]float64{"worker/1": 3, "worker/3": 3}},
		{name: "within noise", in: workers(0.012, 0.0155, 0.0118), want: nil},
		{name: "just under the threshold", in: workers(0.01, 0.01499), want: nil},
		{name: "at the threshold", in: workers(0.01, 0.015), want: map[string]float64{"worker/1": 1.5}},
		{name: "the others of a fast worker are no stragglers", in: workers(0.01, 0.03, 0.03), want: nil},
		{name: "one worker", in: workers(0.05), want: nil},
		{name: "no workers", in: nil, want: nil},
		{name: "too few steps are not compared", in: []WorkerTime{{"worker/0", 100, 1}, {"worker/1", 2, 1}}, want: nil},
		{name: "a worker without steps is left out", in: []WorkerTime{{"worker/0", 100, 1}, {"worker/1", 0, 0}, {"worker/2", 100, 3}}, want: map[string]float64{"worker/2": 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := FindStragglers(c.in, nil)
			if len(got) != len(c.want) {
				t.Fatalf("FindStragglers = %+v, want %v", got, c.want)
			}
			for i, s := range got {
				k, ok := c.want[s.Task]
				if !ok || math.Abs(s.Slowdown-k) > 1e-9 {
					t.Errorf("straggler %+v, want %v", s, c.want)
				}
				if i > 0 && s.Slowdown > got[i-1].Slowdown {
					t.Errorf("not slowest first: %+v", got)
				}
			}
		})
	}
	s := FindStragglers(workers(0.012, 0.036), nil)[0]
	if got, want := s.String(), "worker/1 is 3.0x slower than the others (compute and push 36 ms a step against 12 ms)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

// A sync cluster where worker/1 is 3 times slower: over 10 s, 100 steps
// each; worker/0 computes and pushes in 0.03 s and waits 0.07 s in its
// pulls, worker/1 computes and pushes in 0.09 s and pulls in 0.01 s.
// The host is saturated, but the verdict names the straggler.
func TestVerdictNamesStraggler(t *testing.T) {
	host := proc{cpus: 2, load1: 6}
	snaps := func(barrier bool) []Snapshot {
		ps := func(sum, count float64) string {
			if !barrier {
				return proc{}.text() + "# TYPE pstrain_ps_requests_total counter\npstrain_ps_requests_total{op=\"pull\"} 1\n"
			}
			return psText(withCPU(host, 1, 1), sum, count)
		}
		return []Snapshot{
			{Time: t0, Tasks: []TaskSample{
				up(t, "ps/0", ps(0, 0)),
				up(t, "worker/0", workerText(withCPU(host, 1, 1), 0, 0, 0, 0)),
				up(t, "worker/1", workerText(withCPU(host, 1, 1), 0, 0, 0, 0)),
			}},
			{Time: t0.Add(10 * time.Second), Tasks: []TaskSample{
				up(t, "ps/0", ps(7, 200)),
				up(t, "worker/0", workerText(withCPU(host, 4, 1), 100, 7, 2, 1)),
				up(t, "worker/1", workerText(withCPU(host, 9, 1), 100, 1, 6, 3)),
			}},
		}
	}
	b, err := Compute(snaps(true), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Stragglers) != 1 || b.Stragglers[0].Task != "worker/1" || math.Abs(b.Stragglers[0].Slowdown-3) > 1e-9 {
		t.Fatalf("Stragglers = %+v, want worker/1 at 3x", b.Stragglers)
	}
	if b.Verdict != VerdictBarrier || !strings.Contains(b.Reason, "worker/1 is 3.0x slower") || !strings.Contains(b.Reason, "the others spend 70% of their step pulling") {
		t.Errorf("verdict %q (%s), want %q naming worker/1", b.Verdict, b.Reason, VerdictBarrier)
	}
	if !strings.Contains(b.String(), "; worker/1 is 3.0x slower than the others (compute and push 90 ms a step against 30 ms);") {
		t.Errorf("String = %s", b)
	}
	// Async: no shard holds a pull, so the straggler holds no one back:
	// it is named, and the verdict is the host's.
	b, err = Compute(snaps(false), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Stragglers) != 1 || b.Stragglers[0].Task != "worker/1" || b.Verdict != VerdictCPU {
		t.Errorf("async: stragglers %+v, verdict %q (%s); want worker/1 named and %q", b.Stragglers, b.Verdict, b.Reason, VerdictCPU)
	}
}

func TestStragglerLog(t *testing.T) {
	l := NewStragglerLog()
	if got := l.Stragglers(); got == nil || len(got) != 0 {
		t.Fatalf("empty log: %#v, want an empty list", got)
	}
	s := func(task string, k float64) Straggler { return Straggler{Task: task, Slowdown: k} }
	// One window alone is not enough; a streak broken before
	// StragglerPersist windows is forgotten.
	steps := []struct {
		at    float64
		named []Straggler
		fresh string
	}{
		{1, []Straggler{s("worker/0", 1.6)}, ""},
		{2, nil, ""},
		{3, []Straggler{s("worker/1", 1.8)}, ""},
		{4, []Straggler{s("worker/1", 2.9), s("worker/0", 1.7)}, "worker/1"},
		{5, []Straggler{s("worker/1", 3.1)}, ""},
		{6, nil, ""},
		{7, []Straggler{s("worker/1", 3.0)}, ""},
	}
	for _, st := range steps {
		var fresh []string
		for _, f := range l.Observe(st.at, st.named) {
			fresh = append(fresh, f.Task)
		}
		if strings.Join(fresh, ",") != st.fresh {
			t.Errorf("at %v: counted %v, want %q", st.at, fresh, st.fresh)
		}
	}
	got := l.Stragglers()
	want := RunStraggler{Task: "worker/1", Slowdown: 2.95, DetectedAtSeconds: 4, LastSeenSeconds: 7}
	if len(got) != 1 || got[0].Task != want.Task || math.Abs(got[0].Slowdown-want.Slowdown) > 1e-9 ||
		got[0].DetectedAtSeconds != want.DetectedAtSeconds || got[0].LastSeenSeconds != want.LastSeenSeconds {
		t.Errorf("Stragglers = %+v, want [%+v] (the median of 1.8, 2.9, 3.1, 3.0)", got, want)
	}
}

// The slices: a worker slower on average over the window is named only
// if it was slower in at least half of the slices it was compared in.
func TestFindStragglersSlices(t *testing.T) {
	window := workers(0.01, 0.025) // 2.5x over the window
	slice := func(w0, w1 float64, steps1 float64) []WorkerTime {
		return []WorkerTime{{"worker/0", 20, 20 * w0}, {"worker/1", steps1, steps1 * w1}}
	}
	normal, slow := slice(0.01, 0.011, 20), slice(0.01, 0.03, 20)
	stalled := slice(0.01, 1, 2) // 2 steps: not compared
	cases := []struct {
		name  string
		parts [][]WorkerTime
		named bool
	}{
		{"no slices: the window decides", nil, true},
		{"slower in every slice", [][]WorkerTime{slow, slow, slow, slow, slow}, true},
		{"slower in half", [][]WorkerTime{slow, normal, slow, normal}, true},
		{"slower in fewer than half", [][]WorkerTime{slow, normal, normal, slow, normal}, false},
		// A stall: the seconds of it compare nothing, the others are normal.
		{"stalled once", [][]WorkerTime{normal, stalled, stalled, normal, normal}, false},
		{"compared in no slice", [][]WorkerTime{stalled, stalled}, true},
	}
	for _, c := range cases {
		got := FindStragglers(window, c.parts)
		if named := len(got) == 1 && got[0].Task == "worker/1" && math.Abs(got[0].Slowdown-2.5) < 1e-9; named != c.named || len(got) > 1 {
			t.Errorf("%s: %+v, want worker/1 named: %v", c.name, got, c.named)
		}
	}
}

// Compute cuts the window into slices at its snapshots: a worker that
// stalled for 2 s of a 5 s window is not named, one slower in every
// second is.
func TestComputeStragglerSlices(t *testing.T) {
	host := proc{cpus: 2, load1: 0.5}
	// counts: per second, worker/1's steps and own seconds (compute; push 0).
	run := func(w1 [][2]float64) Breakdown {
		var snaps []Snapshot
		var s0, c0, s1, c1 float64
		for i := 0; i <= len(w1); i++ {
			if i > 0 {
				s0, c0 = s0+50, c0+0.5
				s1, c1 = s1+w1[i-1][0], c1+w1[i-1][1]
			}
			snaps = append(snaps, Snapshot{Time: t0.Add(time.Duration(i) * time.Second), Tasks: []TaskSample{
				up(t, "worker/0", workerText(host, s0, 0.1*s0/50, c0, 0)),
				up(t, "worker/1", workerText(host, s1, 0.1*s1/50, c1, 0)),
			}})
		}
		b, err := Compute(snaps, 2)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// 10 ms a step, but no step for 2 s, then one that took them: the
	// window's mean is 2x the other's.
	stalled := run([][2]float64{{50, 0.5}, {0, 0}, {1, 2.05}, {50, 0.5}, {49, 0.49}})
	if len(stalled.Stragglers) != 0 {
		t.Errorf("stalled 2 s: stragglers %+v, want none", stalled.Stragglers)
	}
	slow := run([][2]float64{{17, 0.51}, {17, 0.51}, {17, 0.51}, {16, 0.48}, {17, 0.51}})
	if len(slow.Stragglers) != 1 || slow.Stragglers[0].Task != "worker/1" || math.Abs(slow.Stragglers[0].Slowdown-3) > 1e-9 {
		t.Errorf("3x slower every second: stragglers %+v, want worker/1 at 3x", slow.Stragglers)
	}
}
