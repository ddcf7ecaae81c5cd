package launcher

import (
	"fmt"
	"time"

	"github.com/pstrain/pstrain/observe/bottleneck"
)

// watchStragglers gives the straggler log the window that ends with the
// monitor's latest snapshot (taken at now), and says on the progress
// when a worker is counted as a straggler.
func (s *supervisor) watchStragglers(mon *bottleneck.Monitor, now time.Time) {
	b, err := mon.Window(bottleneck.StragglerWindow)
	if err != nil {
		return
	}
	at := now.Sub(s.t0).Seconds()
	for _, st := range s.stragglers.Observe(at, b.Stragglers) {
		if s.c.Progress == nil {
			s.c.Log.Warn("straggler", "task", st.Task, "slowdown", fmt.Sprintf("%.2f", st.Slowdown), "at", s.since(now))
			continue
		}
		fmt.Fprintf(s.c.Progress, "straggler at %.1fs: %s\n", at, st)
	}
}
