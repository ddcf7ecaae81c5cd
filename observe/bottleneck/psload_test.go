package bottleneck

import (
	"errors"
	"strconv"
	"testing"
	"time"
)

// psSnap is a snapshot at second sec of two PS tasks, with the
// parameters each holds, and two workers that each pushed shard i
// ps[i][1] gradients in ps[i][2] seconds.
func psSnap(sec int, ps ...[3]float64) Snapshot {
	s := Snapshot{Time: t0.Add(time.Duration(sec) * time.Second)}
	worker := Reading{Counters: map[string]float64{}, Gauges: map[string]float64{}}
	for i, p := range ps {
		shard := strconv.Itoa(i)
		worker.Counters[keyPushCount+shard], worker.Counters[keyShardSum+shard] = p[1], p[2]
		r := Reading{Counters: map[string]float64{}, Gauges: map[string]float64{keyShardParams: p[0]}}
		s.Tasks = append(s.Tasks, TaskSample{Target: Target{Task: "ps/" + shard}, Up: true, Reading: r})
	}
	for _, w := range []string{"worker/0", "worker/1"} {
		s.Tasks = append(s.Tasks, TaskSample{Target: Target{Task: w}, Up: true, Reading: worker})
	}
	return s
}

// TestPSLoads: the window's deltas of each PS's push count and seconds,
// with the parameters it holds; the window starts no earlier than the
// current layout (start-up's zero parameters, the layout before a
// change) and no earlier than d before the newest snapshot.
func TestPSLoads(t *testing.T) {
	m := &Monitor{snaps: []Snapshot{
		psSnap(0, [3]float64{0, 0, 0}, [3]float64{0, 0, 0}),          // start-up
		psSnap(1, [3]float64{100, 10, 1}, [3]float64{100, 10, 0.5}),  // even layout
		psSnap(2, [3]float64{100, 30, 3}, [3]float64{100, 30, 1.5}),  //
		psSnap(3, [3]float64{50, 40, 3.5}, [3]float64{150, 40, 2}),   // rebalanced
		psSnap(4, [3]float64{50, 60, 4.5}, [3]float64{150, 60, 3}),   //
		psSnap(5, [3]float64{50, 100, 6.5}, [3]float64{150, 100, 5}), //
	}}
	got, err := m.PSLoads(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := []PSLoad{{Task: "ps/0", Params: 50, Pushes: 120, Seconds: 6}, {Task: "ps/1", Params: 150, Pushes: 120, Seconds: 6}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("PSLoads over the rebalanced layout = %+v, want %+v", got, want)
	}
	if got, _ := m.PSLoads(time.Second); got[0].Pushes != 80 || got[0].Seconds != 4 {
		t.Errorf("PSLoads over the last second = %+v, want 80 pushes in 4 s", got)
	}
	m.snaps[4].Tasks[3].Up = false // worker/1 down at the window's start: left out
	if got, _ := m.PSLoads(time.Second); got[0].Pushes != 40 || got[0].Seconds != 2 {
		t.Errorf("PSLoads with worker/1 down = %+v, want 40 pushes in 2 s", got)
	}
	m.snaps = m.snaps[:2]
	if _, err := m.PSLoads(10 * time.Second); !errors.Is(err, ErrTooFewSnapshots) {
		t.Errorf("one snapshot of the layout: %v, want ErrTooFewSnapshots", err)
	}
	m.snaps = []Snapshot{psSnap(0, [3]float64{100, 50, 5}, [3]float64{100, 50, 5}), psSnap(1, [3]float64{100, 5, 1}, [3]float64{100, 60, 6})}
	if _, err := m.PSLoads(10 * time.Second); err == nil {
		t.Error("a worker whose counters went back (a restart): no error")
	}
}

// TestPSLoadsAfterAPSIsTakenOut: a PS a change of the count took out is
// down in every later snapshot; the shards left are still measured (it
// used to leave no window of the current layout).
func TestPSLoadsAfterAPSIsTakenOut(t *testing.T) {
	m := &Monitor{snaps: []Snapshot{
		psSnap(0, [3]float64{100, 10, 1}, [3]float64{100, 10, 1}, [3]float64{100, 10, 1}), // 3 PS
		psSnap(1, [3]float64{150, 40, 4}, [3]float64{150, 40, 2}, [3]float64{0, 10, 1}),   // 2 PS, ps/2 out
		psSnap(2, [3]float64{150, 70, 7}, [3]float64{150, 70, 3}, [3]float64{0, 10, 1}),
	}}
	for _, s := range m.snaps[1:] {
		s.Tasks[2].Up = false
	}
	got, err := m.PSLoads(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := []PSLoad{{Task: "ps/0", Params: 150, Pushes: 60, Seconds: 6}, {Task: "ps/1", Params: 150, Pushes: 60, Seconds: 2}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("PSLoads after ps/2 was taken out = %+v, want %+v", got, want)
	}
}
