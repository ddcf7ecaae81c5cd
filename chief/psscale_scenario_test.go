package chief

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/internal/scenariotest"
	"github.com/pstrain/pstrain/ml/partition"
)

// psCommand is a scenario's command of a PS count change
// (core_psscale.go; testdata/38_ps_scale.txt):
//
//	ps-scale N t=S               ask for N parameter servers (Core.ScalePS)
//	ps-heartbeat W ps=N [weights=A:B] t=S  worker W's heartbeat says its
//	                             layout has N shards (with those weights);
//	                             prints the layout it is told to use
//	ps-rebalance A:B [imbalance=X] t=S  ask for the weights A:B (Core.Rebalance)
//	ps-snapshotted t=S step=N [version=V] [err=MSG]  the SnapshotShards
//	                             is done (version: the highest a shard wrote)
//	ps-switched t=S version=V    the SwitchLayout is done
//	ps-switch-failed t=S err=MSG [untouched]  the SwitchLayout failed
//	                             (untouched: before any Init)
//	ps-slot-answers ROLE N       a restarted chief finds the process of
//	                             slot N beyond the layout answering
//	ps-hold-awaited              whether the chief polls at once for a
//	                             sync change's hold (Core.PSHoldAwaited)
//	ps-state                     the count in effect, the target, what
//	                             workers are told, the hold, the changes
func (s *scenario) psCommand(f []string, a scenariotest.Args) (string, error) {
	c := s.core
	now := a.At(s.t0)
	var acts []Action
	switch f[0] {
	case "ps-scale":
		n, _ := strconv.Atoi(f[1])
		if err := c.ScalePS(n, now); err != nil {
			return "error: " + err.Error(), nil
		}
		return "ok", nil
	case "ps-heartbeat":
		w, _ := strconv.Atoi(f[1])
		if _, err := c.Heartbeat(w, now); err != nil {
			return "error: " + err.Error(), nil
		}
		l := partition.LayoutOf(int(a.Num("ps")), weightsArg(a["weights"]))
		return fmt.Sprintf("ok ps=%s", c.HeartbeatPS(w, l)), nil
	case "ps-rebalance":
		imb, _ := strconv.ParseFloat(a["imbalance"], 64)
		if err := c.Rebalance(weightsArg(f[1]), imb, now); err != nil {
			return "error: " + err.Error(), nil
		}
		return "ok", nil
	case "ps-state":
		return s.psState(), nil
	case "ps-hold-awaited":
		return strconv.FormatBool(c.PSHoldAwaited()), nil
	case "ps-snapshotted":
		res := CheckpointResult{Step: a.Num("step"), Version: a.Num("version")}
		if e, ok := a["err"]; ok {
			res.Err = errors.New(e)
		}
		acts = c.Snapshotted(now, res)
	case "ps-switched":
		acts = c.LayoutSwitched(now, a.Num("version"))
	case "ps-slot-answers":
		n, _ := strconv.Atoi(f[2])
		c.SlotAnswers(f[1], n)
		return "ok", nil
	case "ps-switch-failed":
		_, untouched := a["untouched"]
		acts = c.LayoutSwitchFailed(now, errors.New(a["err"]), !untouched)
	default:
		return "", fmt.Errorf("unknown event %q", f[0])
	}
	return s.actions(acts), nil
}

func (s *scenario) psState() string {
	c := s.core
	out := fmt.Sprintf("ps=%d target=%d layout=%s hold=%d generation=%d latest-checkpoint=%d", c.PSCount(), c.PSTarget(),
		c.Layout(), c.psHoldAt(), c.Generation(), c.LatestCheckpoint())
	for _, m := range c.st.Membership {
		if m.Role != "ps" {
			continue
		}
		out += fmt.Sprintf("\nchange ps=%d->%d step=%d asked=%.2f at=%.2f pause=%.2f steps-lost=%d",
			m.From, m.To, m.Step, m.AskedSeconds, m.Seconds, *m.PauseSeconds, *m.StepsLost)
		if m.Kind != "" {
			out += fmt.Sprintf(" kind=%s weights=%v imbalance=%.2f moved=%d", m.Kind, m.Weights, m.Imbalance, m.MovedParameters)
		}
	}
	return out
}

// weightsArg reads "A:B:..." as weights (none for "").
func weightsArg(s string) []int {
	var out []int
	for _, p := range strings.Split(s, ":") {
		if n, err := strconv.Atoi(p); err == nil {
			out = append(out, n)
		}
	}
	return out
}
