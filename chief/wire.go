package chief

import (
	"github.com/pstrain/pstrain/observe/report"
)

// wireState is what the workers' heartbeats say their pushes and pulls
// carried: per worker, the counts of its current process and the sum of
// its earlier processes' (a restarted worker counts from 0 again).
type wireState struct {
	wireNow, wireBefore map[int]wireCounts
}

// wireCounts are a worker's steps done and the payload bytes of its
// pushes and pulls.
type wireCounts struct {
	steps, push, pull int64
}

func (a wireCounts) plus(b wireCounts) wireCounts {
	return wireCounts{a.steps + b.steps, a.push + b.push, a.pull + b.pull}
}

// WireCounts records a worker's heartbeat counts: steps done and the
// bytes its pushes and pulls carried since its process started. Counts
// lower than the last ones are a new process's.
func (c *Core) WireCounts(worker int, steps, push, pull int64) {
	if c.wireNow == nil {
		c.wireNow, c.wireBefore = map[int]wireCounts{}, map[int]wireCounts{}
	}
	now := wireCounts{steps, push, pull}
	if last := c.wireNow[worker]; now.steps < last.steps || now.push < last.push || now.pull < last.pull {
		c.wireBefore[worker] = c.wireBefore[worker].plus(last)
	}
	c.wireNow[worker] = now
}

// wireReport is the report's wire section: the bytes per worker step
// every worker's pushes and pulls carried, over the run.
func (c *Core) wireReport() report.Wire {
	var sum wireCounts
	for w, n := range c.wireNow {
		sum = sum.plus(n).plus(c.wireBefore[w])
	}
	out := report.Wire{Compress: c.p.Run.CompressSetting().String(), Steps: sum.steps}
	if sum.steps > 0 {
		out.PushBytesPerStep = float64(sum.push) / float64(sum.steps)
		out.PullBytesPerStep = float64(sum.pull) / float64(sum.steps)
	}
	return out
}
