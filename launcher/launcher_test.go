package launcher

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/report"
)

func TestParseFaults(t *testing.T) {
	r := config.Default() // 2 PS, 2 workers
	got, err := ParseFaults("ps/1@8s, worker/0@12.5s,chief@20s,chief/0@1m", r)
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{{"ps/1", 8 * time.Second}, {"worker/0", 12500 * time.Millisecond}, {"chief", 20 * time.Second}, {"chief", time.Minute}}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("fault %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if f, err := ParseFaults("", r); err != nil || f != nil {
		t.Errorf("empty spec: %v, %v", f, err)
	}
	for _, bad := range []string{"ps/2@1s", "worker/5@1s", "ps/0", "ps/0@soon", "ps/0@-1s", "gpu/0@1s", "ps/0@1s,,"} {
		if _, err := ParseFaults(bad, r); err == nil || !strings.Contains(err.Error(), "--fault") {
			t.Errorf("ParseFaults(%q) = %v, want an error naming --fault", bad, err)
		}
	}
}

func TestMergeRestarts(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	back := func(s float64) *float64 { return &s }
	chief := []report.Restart{
		{Task: "ps/1", KilledAtSeconds: 5.2, BackAtSeconds: back(6.5), RestoredStep: 100},
		{Task: "worker/0", BackAtSeconds: back(9), RestoredStep: 250},
		{Task: "worker/1", BackAtSeconds: back(12), RestoredStep: 300}, // restarted by hand
	}
	seen := []restart{
		{task: "ps/1", exitedAt: at(5), backAt: at(5.3)},
		{task: "worker/0", exitedAt: at(8), backAt: at(8.3)},
		{task: "worker/0", exitedAt: at(10), backAt: at(10.4)}, // never rejoined before the end
	}
	got := mergeRestarts(chief, seen, 1000)
	if len(got) != 4 {
		t.Fatalf("%d restarts, want 4: %+v", len(got), got)
	}
	check := func(i int, task string, killed, backAt float64, step int64) {
		t.Helper()
		g := got[i]
		near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
		if g.Task != task || !near(g.KilledAtSeconds, killed) || g.BackAtSeconds == nil || !near(*g.BackAtSeconds, backAt) || g.RestoredStep != step {
			t.Errorf("restart %d: %+v (back %v), want %s killed %.1f back %.1f step %d", i, g, *g.BackAtSeconds, task, killed, backAt, step)
		}
	}
	check(0, "ps/1", 5, 6.5, 100)      // kill time from the launcher, the rest from the chief
	check(1, "worker/0", 8, 9, 250)    //
	check(2, "worker/0", 10, 10.4, -1) // no chief record: process start, step unknown
	check(3, "worker/1", 0, 12, 300)   // chief-only record kept
}
