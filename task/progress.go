package task

import (
	"fmt"
	"time"

	"github.com/pstrain/pstrain/chief"
)

// progressEvery is the least time between two progress lines.
const progressEvery = time.Second

// progressLines turns the chief's progress snapshots into the progress
// lines of `pstrain chief --progress` (and so of `pstrain run`). The rate
// and the ETA are measured between the snapshot of the previous line and
// this one, over at least progressEvery of training (the snapshots'
// Elapsed: no wall clock), so nothing is printed before the first step nor
// until a rate has been measured: a first line of "0 samples/s, ETA 0.0s",
// or the rate of a start-up still in progress, says nothing. Not safe for
// concurrent use; the chief reports progress from one goroutine.
type progressLines struct {
	last chief.Progress
	have bool // last is the snapshot of a line, or the first step's
}

// next returns the line for p, or false when none is due.
func (pl *progressLines) next(p chief.Progress) (string, bool) {
	switch {
	case p.Step == 0:
		return "", false
	case !pl.have || p.Step < pl.last.Step || p.Elapsed < pl.last.Elapsed:
		// The first step (or a rollback, or a restarted clock): the
		// window starts here.
		pl.last, pl.have = p, true
		return "", false
	case p.Elapsed-pl.last.Elapsed < progressEvery:
		return "", false
	}
	prev := pl.last
	pl.last = p
	return formatProgress(p, prev), true
}

// samplesDone is how many samples the snapshot's steps hold: the chief's
// rate is over the whole of Elapsed.
func samplesDone(p chief.Progress) float64 { return p.SamplesPerSec * p.Elapsed.Seconds() }

// formatProgress renders p's line, with the rate and the ETA measured
// since prev.
func formatProgress(p, prev chief.Progress) string {
	dt := (p.Elapsed - prev.Elapsed).Seconds()
	rate := (samplesDone(p) - samplesDone(prev)) / dt
	eta := "      -"
	if steps := p.Step - prev.Step; steps > 0 && p.MaxStep > p.Step {
		left := time.Duration(float64(p.MaxStep-p.Step) / float64(steps) * dt * float64(time.Second))
		eta = fmt.Sprintf("%6.1fs", left.Seconds())
	} else if p.MaxStep <= p.Step {
		eta = fmt.Sprintf("%6.1fs", 0.0)
	}
	// A loss of exactly 0 is no push yet since the shard (re)started: the
	// mean cross-entropy of a batch is never 0 in float32 practice.
	loss := "   -  "
	if p.Loss != 0 {
		loss = fmt.Sprintf("%.4f", p.Loss)
	}
	score := "test acc   -   "
	switch {
	case p.LastAUC > 0: // a CTR model: its accuracy at 0.5 says little
		score = fmt.Sprintf("test auc %.4f", p.LastAUC)
	case p.LastAccuracy >= 0:
		score = fmt.Sprintf("test acc %5.2f%%", 100*p.LastAccuracy)
	}
	return fmt.Sprintf("step %6d/%d  epoch %5.2f  %7.0f samples/s  loss %s  %s  workers %d  elapsed %5.1fs  ETA %s",
		p.Step, p.MaxStep, p.Epoch, rate, loss, score, p.LiveWorkers, p.Elapsed.Seconds(), eta)
}
