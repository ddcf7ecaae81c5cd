package worker

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/ps"
)

func TestParseGradientFaults(t *testing.T) {
	got, err := ParseGradientFaults(" worker/1@30:1e6, worker/3@every:-4", 4)
	want := []GradientFault{{Worker: 1, Step: 30, Scale: 1e6}, {Worker: 3, Every: true, Scale: -4}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %+v, %v; want %+v", got, err, want)
	}
	if s := got[0].String() + " " + got[1].String(); s != "worker/1@30:1e+06 worker/3@every:-4" {
		t.Errorf("String: %q", s)
	}
	if got, err := ParseGradientFaults("", 2); err != nil || got != nil {
		t.Errorf("empty: %v, %v", got, err)
	}
	for _, bad := range []string{"worker/2@30:2", "worker/-1@1:2", "ps/0@1:2", "worker/0:1:2", "worker/0@x:2",
		"worker/0@-1:2", "worker/0@1:NaN", "worker/0@1:inf", "worker/0@1:", "worker/0@1"} {
		if _, err := ParseGradientFaults(bad, 2); err == nil || !strings.Contains(err.Error(), "--fault-gradient") {
			t.Errorf("%q: %v, want an error naming the flag", bad, err)
		}
	}
}

// A one-time fault fires once, at the first gradient of its step or
// later (a worker may skip versions), and never again, not even after a
// rollback brings the version back; an every-step fault fires always.
func TestFaultsFire(t *testing.T) {
	fs := faults{list: []GradientFault{{Step: 30, Scale: 100}, {Every: true, Scale: -2}}, fired: make([]bool, 2)}
	for _, c := range []struct {
		version int64
		want    float32
	}{{0, -2}, {29, -2}, {31, -200}, {32, -2}, {30, -2}, {5, -2}} {
		if got := fs.scale(c.version); got != c.want {
			t.Errorf("version %d: scale %v, want %v", c.version, got, c.want)
		}
	}
}

// A step's fault factor is taken at the highest version the pulls
// answered, and scale multiplies every segment of the gradient in place.
func TestFaultScalesTheGradient(t *testing.T) {
	c := NewCore(CoreParams{Index: 1, Shards: 2, Faults: []GradientFault{{Worker: 1, Step: 7, Scale: 10}}},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	grads := [][]float32{{1, 2}, {-3}}
	c.views = []ps.PullView{{Version: 6}, {Version: 6}}
	scale(grads, c.scale())
	if grads[0][1] != 2 {
		t.Fatalf("poisoned before step 7: %v", grads)
	}
	c.views = []ps.PullView{{Version: 6}, {Version: 7}}
	scale(grads, c.scale())
	if !slices.Equal(grads[0], []float32{10, 20}) || grads[1][0] != -30 {
		t.Errorf("at step 7: %v, want [[10 20] [-30]]", grads)
	}
}
