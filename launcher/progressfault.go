package launcher

// Faults triggered by the run's progress rather than the clock
// (`--fault ps/1@step:40`, `--fault ps/1@checkpoint:1+300ms`): the kill
// lands at the same point of training however fast the machine runs.

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pstrain/pstrain/cluster"
	"github.com/pstrain/pstrain/observe/metrics"
)

// Mark is a point in a run's progress that a fault waits for. The zero
// Mark is no condition (the fault is on the clock).
type Mark struct {
	// Step: the chief's global step (pstrain_global_step, the lowest
	// shard version it last read) is at least Step; 0 = no condition.
	Step int64
	// Checkpoints: the chief has committed at least this many
	// checkpoints during the run; 0 = no condition.
	Checkpoints int64
}

// IsZero says m is no condition.
func (m Mark) IsZero() bool { return m == Mark{} }

// String is m as --fault writes it: step:40, checkpoint:1.
func (m Mark) String() string {
	switch {
	case m.Step > 0:
		return "step:" + strconv.FormatInt(m.Step, 10)
	case m.Checkpoints > 0:
		return "checkpoint:" + strconv.FormatInt(m.Checkpoints, 10)
	}
	return "start"
}

// Reached says whether the run, at p, has reached m.
func (m Mark) Reached(p RunProgress) bool {
	return p.Step >= m.Step && p.Checkpoints >= m.Checkpoints
}

// RunProgress is how far the run is, as the launcher reads it from the
// chief's metrics.
type RunProgress struct {
	Step        int64 // the chief's global step
	Checkpoints int64 // checkpoints committed during the run
}

// Prefixes of the progress forms of a fault's time.
const (
	markStep       = "step:"
	markCheckpoint = "checkpoint:"
)

// parseFaultTime reads what follows TASK@ in a --fault entry: a duration
// since the start (8s), or a mark with an optional delay after it
// (step:40, checkpoint:1+300ms).
func parseFaultTime(s string) (Mark, time.Duration, error) {
	var m Mark
	var field *int64
	switch {
	case strings.HasPrefix(s, markStep):
		field, s = &m.Step, strings.TrimPrefix(s, markStep)
	case strings.HasPrefix(s, markCheckpoint):
		field, s = &m.Checkpoints, strings.TrimPrefix(s, markCheckpoint)
	default:
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return Mark{}, 0, fmt.Errorf("%q is not a duration (e.g. 8s), step:N or checkpoint:N", s)
		}
		return Mark{}, d, nil
	}
	n, delay, hasDelay := strings.Cut(s, "+")
	v, err := strconv.ParseInt(n, 10, 64)
	if err != nil || v < 1 {
		return Mark{}, 0, fmt.Errorf("%q is not a count of at least 1", n)
	}
	*field = v
	var d time.Duration
	if hasDelay {
		if d, err = time.ParseDuration(delay); err != nil || d < 0 {
			return Mark{}, 0, fmt.Errorf("the delay %q is not a duration (e.g. 300ms)", delay)
		}
	}
	return m, d, nil
}

// progressTracker turns scrapes of the chief's metrics into the run's
// RunProgress. The chief's checkpoint count starts again from 0 when the
// chief restarts; the tracker adds it up across restarts, as
// Prometheus' increase() does.
type progressTracker struct {
	p         RunProgress
	lastCount int64 // the chief's count at the previous scrape
}

// observe records a scrape of the chief: its global step and its count
// of committed checkpoints.
func (t *progressTracker) observe(step, count int64) RunProgress {
	if count < t.lastCount {
		t.lastCount = 0 // the chief restarted
	}
	t.p.Checkpoints += count - t.lastCount
	t.lastCount = count
	t.p.Step = step
	return t.p
}

// readChiefProgress reads the chief's global step and count of
// committed checkpoints from a scrape of its metrics; ok is false when
// the chief exports no global step (not yet registered).
func readChiefProgress(f metrics.Families) (step, count int64, ok bool) {
	v, ok := f.Value(metrics.MetricGlobalStep, nil)
	if !ok {
		return 0, 0, false
	}
	if h, found := f.Histogram(metrics.MetricCheckpointDuration, nil); found {
		count = int64(h.Count)
	}
	return int64(v), count, true
}

// progressPollEvery is how often the launcher reads the chief's metrics
// while a fault waits for a mark (the chief reads the shards as often).
const progressPollEvery = 100 * time.Millisecond

// scrapeFunc reads one scrape of the chief's metrics.
type scrapeFunc func(ctx context.Context) (metrics.Families, error)

// watchMarks reads the chief's progress every tick and closes reached[i]
// once marks[i] is reached, setting reached[i] to nil. It returns when
// every mark is reached or ctx ends. A scrape that fails (the chief
// starting or restarting) is skipped.
func watchMarks(ctx context.Context, tick <-chan time.Time, scrape scrapeFunc, marks []Mark, reached []chan struct{}, onReach func(i int, p RunProgress)) {
	var tr progressTracker
	pending := len(marks)
	for pending > 0 {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		f, err := scrape(ctx)
		if err != nil {
			continue
		}
		step, count, ok := readChiefProgress(f)
		if !ok {
			continue
		}
		p := tr.observe(step, count)
		for i, m := range marks {
			if reached[i] != nil && m.Reached(p) {
				onReach(i, p)
				close(reached[i])
				reached[i] = nil
				pending--
			}
		}
	}
}

// startMarkWatch starts the watch of the faults that wait for a mark, if
// any, on a goroutine of g, and returns each fault's channel, closed when
// its mark is reached (nil for a fault on the clock).
func (s *supervisor) startMarkWatch(g group) []<-chan struct{} {
	out := make([]<-chan struct{}, len(s.c.Faults))
	var marks []Mark
	var chans []chan struct{}
	var which []int
	for i, f := range s.c.Faults {
		if f.When.IsZero() {
			continue
		}
		ch := make(chan struct{})
		out[i] = ch
		marks, chans, which = append(marks, f.When), append(chans, ch), append(which, i)
	}
	if len(marks) == 0 {
		return out
	}
	url := s.web.URL(s.plan.metricsAddr(s.plan.chiefIndex()), metrics.MetricsPath)
	client := s.web.HTTP(0)
	scrape := func(ctx context.Context) (metrics.Families, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return metrics.ScrapeWith(ctx, client, url)
	}
	onReach := func(i int, p RunProgress) {
		f := s.c.Faults[which[i]]
		s.c.Log.Info("fault: progress mark reached", "task", f.Task, "mark", f.When.String(), "step", p.Step, "checkpoints", p.Checkpoints, "delay", f.At)
	}
	g.goDo(func() {
		defer closeIdle(client)
		tick := time.NewTicker(progressPollEvery)
		defer tick.Stop()
		watchMarks(g.ctx, tick.C, scrape, marks, chans, onReach)
		for i, ch := range chans {
			if ch != nil {
				f := s.c.Faults[which[i]]
				s.c.Log.Warn("fault: the run ended before its mark; the task was not killed", "task", f.Task, "mark", f.When.String())
			}
		}
	})
	return out
}

// closeIdle closes c's idle connections.
func closeIdle(c *http.Client) { c.CloseIdleConnections() }

// chiefIndex is the chief's index in p.tasks.
func (p plan) chiefIndex() int {
	for i, t := range p.tasks {
		if t.Type == cluster.Chief {
			return i
		}
	}
	return 0
}
