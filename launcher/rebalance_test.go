package launcher

import (
	"strings"
	"testing"

	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/bottleneck"
)

// TestLayoutLoads: the loads of ps/0..ps/n-1 by index, whatever order the
// monitor lists them in (standbys and slots past the count left out); a
// PS of the layout the monitor does not scrape (started after launch)
// is an error.
func TestLayoutLoads(t *testing.T) {
	measured := []bottleneck.PSLoad{{Task: "ps/1", Params: 2, Pushes: 20, Seconds: 1}, {Task: "standby/0", Params: 9},
		{Task: "ps/0", Params: 1, Pushes: 30, Seconds: 2}, {Task: "ps/2"}} // (ps/2: started, holding nothing yet)
	got, err := layoutLoads(measured, 2)
	want := []partition.Load{{Params: 1, Pushes: 30, Seconds: 2}, {Params: 2, Pushes: 20, Seconds: 1}}
	if err != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("layoutLoads = %+v, %v; want %+v", got, err, want)
	}
	if _, err := layoutLoads(measured[:2], 2); err == nil {
		t.Error("ps/0 not measured: no error")
	}
	// 3 shards hold parameters and 2 are asked for (or 2 and 3): a change
	// of the count is under way.
	measured[3].Params = 3
	if _, err := layoutLoads(measured, 2); err == nil || !strings.Contains(err.Error(), "under way") {
		t.Errorf("3 PS holding parameters, 2 asked for: %v, want a change under way", err)
	}
	if _, err := layoutLoads(measured[:3], 3); err == nil || !strings.Contains(err.Error(), "under way") {
		t.Errorf("2 PS holding parameters, 3 asked for: %v, want a change under way", err)
	}
}
