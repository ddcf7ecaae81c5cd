package chief

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/pstrain/pstrain/internal/scenariotest"
)

// psCommand is a scenario's command of a PS count change
// (core_psscale.go; testdata/38_ps_scale.txt):
//
//	ps-scale N t=S               ask for N parameter servers (Core.ScalePS)
//	ps-heartbeat W ps=N t=S      worker W's heartbeat says its layout has N
//	                             shards; prints the count it is told to use
//	ps-snapshotted t=S step=N [version=V] [err=MSG]  the SnapshotShards
//	                             is done (version: the highest a shard wrote)
//	ps-switched t=S version=V    the SwitchLayout is done
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
		return fmt.Sprintf("ok ps=%d", c.HeartbeatPS(w, int(a.Num("ps")))), nil
	case "ps-state":
		return s.psState(), nil
	case "ps-snapshotted":
		res := CheckpointResult{Step: a.Num("step"), Version: a.Num("version")}
		if e, ok := a["err"]; ok {
			res.Err = errors.New(e)
		}
		acts = c.Snapshotted(now, res)
	case "ps-switched":
		acts = c.LayoutSwitched(now, a.Num("version"))
	default:
		return "", fmt.Errorf("unknown event %q", f[0])
	}
	var lines []string
	for _, x := range acts {
		lines = append(lines, x.String())
	}
	if len(lines) == 0 {
		return "(nothing)", nil
	}
	return strings.Join(lines, "\n"), nil
}

func (s *scenario) psState() string {
	c := s.core
	out := fmt.Sprintf("ps=%d target=%d layout=%d hold=%d generation=%d latest-checkpoint=%d", c.PSCount(), c.PSTarget(),
		c.LayoutPS(), c.psHoldAt(), c.Generation(), c.LatestCheckpoint())
	for _, m := range c.st.Membership {
		if m.Role != "ps" {
			continue
		}
		out += fmt.Sprintf("\nchange ps=%d->%d step=%d asked=%.2f at=%.2f pause=%.2f steps-lost=%d",
			m.From, m.To, m.Step, m.AskedSeconds, m.Seconds, *m.PauseSeconds, *m.StepsLost)
	}
	return out
}
