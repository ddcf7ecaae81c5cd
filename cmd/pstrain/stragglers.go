package main

import (
	"fmt"

	"github.com/pstrain/pstrain/observe/bottleneck"
)

// stragglerLine is the summary's line for a worker the run counted as a
// straggler, e.g. "straggler: worker/1, 2.7x slower than the others,
// from 4.3 s to 15.2 s".
func stragglerLine(s bottleneck.RunStraggler) string {
	return fmt.Sprintf("straggler: %s, %.1fx slower than the others, from %.1f s to %.1f s", s.Task, s.Slowdown, s.DetectedAtSeconds, s.LastSeenSeconds)
}
