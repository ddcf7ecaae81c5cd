package launcher

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/config"
)

// TestPSRefusal: the runs whose PS count cannot change say why before a
// process starts; a run with checkpoints can, in every mode, with hot
// standbys or without, a CTR model's too (its rows move). A CTR run
// cannot be rebalanced: weights do not move its rows.
func TestPSRefusal(t *testing.T) {
	ok := config.Default()
	ok.CheckpointDir = "ck"
	for _, mode := range []config.Mode{config.Sync, config.Async, config.SSP} {
		for _, replicas := range []int{0, 1} {
			r := ok
			r.Mode, r.PSReplicas = mode, replicas
			if why := psRefusal(r); why != "" {
				t.Fatalf("a %s run with checkpoints and --ps-replicas %d refused: %s", mode, replicas, why)
			}
			if why := rebalanceRefusal(r); why != "" {
				t.Fatalf("a rebalance of a %s run with checkpoints and --ps-replicas %d refused: %s", mode, replicas, why)
			}
		}
	}
	ctr := ok
	ctr.Model = config.ModelKind("ctr")
	if why := psRefusal(ctr); why != "" {
		t.Errorf("a CTR run's PS count change refused: %s", why)
	}
	if why := rebalanceRefusal(ctr); !strings.Contains(why, "hash of their key") {
		t.Errorf("a CTR run's rebalance: refusal %q, want one saying the rows are placed by key", why)
	}
	noCk := ok
	noCk.CheckpointDir = ""
	for _, refusal := range []func(config.Run) string{psRefusal, rebalanceRefusal} {
		if why := refusal(noCk); !strings.Contains(why, "--checkpoint-dir") {
			t.Errorf("refusal %q, want one naming --checkpoint-dir", why)
		}
	}
}

// A standby that exits while a request removes its slot is not
// restarted; a later request that keeps the slot (its ps/k still runs,
// the chief never switched) starts it again, and only it.
func TestStandbyOfAKeptSlotStartsAgain(t *testing.T) {
	r := config.Default()
	r.PS, r.MaxPS, r.PSReplicas = 3, 3, 1
	s := &supervisor{c: Config{Run: r, Dir: t.TempDir(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	s.plan.psSlots = 3
	s.scaler = &scaler{s: s, slotSet: slotSet{role: cluster.Worker, slots: 1, target: 1, running: map[int]bool{}}}
	s.psScale = &psScaler{s: s, slotSet: slotSet{role: cluster.PS, slots: 3, target: 3, running: map[int]bool{0: true, 1: true, 2: true}},
		standbys: map[int]bool{0: true, 1: true, 2: true}}
	var primaries, standbys []int
	s.psScale.start = func(t cluster.Task) error { primaries = append(primaries, t.Index); return nil }
	s.psScale.startStandby = func(k int) error { standbys = append(standbys, k); return nil }
	s.psScale.apply(2) // pstrain scale --ps 2
	if !s.psScale.retiring(2) {
		t.Fatal("slot 2 is not retiring after --ps 2")
	}
	s.psScale.standbyExited(2) // standby/2 ends before the switch: not restarted
	s.psScale.apply(3)         // pstrain scale --ps 3: ps/2 still runs
	if len(primaries) != 0 || !slices.Equal(standbys, []int{2}) {
		t.Errorf("after --ps 3 started primaries %v and standbys %v, want none and [2]", primaries, standbys)
	}
}
