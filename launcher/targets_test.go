package launcher

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pstrain/pstrain/cluster"
)

// TestTargetsListOnlyLiveTasks: the file_sd file follows the tasks and
// is an empty list (not null, not missing) when the run is over.
func TestTargetsListOnlyLiveTasks(t *testing.T) {
	dir := t.TempDir()
	tasks := (cluster.Spec{Chief: []string{"a"}, PS: []string{"b"}, Worker: []string{"c"}}).Tasks()
	addrs := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
	tg := newTargets(dir, tasks, func(i int) string { return addrs[i] })
	read := func() []string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, "pstrain.json"))
		if err != nil {
			t.Fatal(err)
		}
		var gs []struct {
			Targets []string          `json:"targets"`
			Labels  map[string]string `json:"labels"`
		}
		if err := json.Unmarshal(b, &gs); err != nil || gs == nil {
			t.Fatalf("targets file %q: %v", b, err)
		}
		var out []string
		for _, g := range gs {
			out = append(out, g.Labels["task"]+"@"+g.Targets[0]+"/"+g.Labels["role"])
		}
		return out
	}
	if err := tg.setAll(true); err != nil {
		t.Fatal(err)
	}
	if got, want := read(), []string{"chief@127.0.0.1:1/chief", "ps/0@127.0.0.1:2/ps", "worker/0@127.0.0.1:3/worker"}; !slices.Equal(got, want) {
		t.Errorf("all live: %v, want %v", got, want)
	}
	tg.set(1, false)
	if got, want := read(), []string{"chief@127.0.0.1:1/chief", "worker/0@127.0.0.1:3/worker"}; !slices.Equal(got, want) {
		t.Errorf("ps/0 gone: %v, want %v", got, want)
	}
	tg.setAll(false)
	if got := read(); len(got) != 0 {
		t.Errorf("run over: %v, want none", got)
	}
	if err := newTargets("", tasks, nil).setAll(true); err != nil {
		t.Errorf("no sd dir: %v", err)
	}
}
