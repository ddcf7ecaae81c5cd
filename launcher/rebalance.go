package launcher

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pstrain/pstrain/chief"
	"github.com/pstrain/pstrain/ml/partition"
	"github.com/pstrain/pstrain/observe/bottleneck"
)

// Rebalancing (docs/elastic.md, "Rebalancing"). `pstrain scale --run-dir
// DIR --rebalance` writes a request with "rebalance" (RequestRebalance);
// the launcher, which scrapes every task each second, measures each
// PS's load over the last RebalanceWindow (bottleneck.Monitor.PSLoads),
// decides (partition.PlanRebalance) and answers in the status file:
// either the weights it asked of the chief, by writing the request again
// with them, or why it refused. The chief moves the rows as it does for
// a change of the PS count.

// RebalanceWindow is how far back the launcher's measurement of the
// shards' load reaches.
const RebalanceWindow = 5 * time.Second

// rebalanceAnswerWait bounds RequestRebalance's wait for the launcher's
// answer (it polls the request file every 200 ms and measures at once).
const rebalanceAnswerWait = 10 * time.Second

// RebalanceAnswer is the launcher's answer to a rebalance request, in
// ScaleStatusFile.
type RebalanceAnswer struct {
	Seq int64 `json:"seq"` // the request's
	// Loads are the loads measured (for a person), Imbalance the slowest
	// shard's time per step over the fastest's.
	Loads     string  `json:"loads,omitempty"`
	Imbalance float64 `json:"imbalance,omitempty"`
	// Weights are the new layout's, asked of the chief; Refused says why
	// none were ("": asked).
	Weights []int  `json:"weights,omitempty"`
	Refused string `json:"refused,omitempty"`
}

// RequestRebalance asks the `pstrain run` on dir to rebalance its
// parameter servers and waits for the launcher's answer. A refusal (the
// run cannot change its layout, its load cannot be measured, or is even)
// is an ErrBadScale with the answer.
func RequestRebalance(dir string) (RebalanceAnswer, error) {
	st, err := runScaleStatus(dir)
	if err != nil {
		return RebalanceAnswer{}, err
	}
	if st.PSRefusal != "" {
		return RebalanceAnswer{}, fmt.Errorf("%w: %s", ErrBadScale, st.PSRefusal)
	}
	seq, err := writeScaleRequestSeq(dir, chief.ScaleRequest{Rebalance: true})
	if err != nil {
		return RebalanceAnswer{}, err
	}
	deadline := time.Now().Add(rebalanceAnswerWait)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		st, err := readScaleStatus(dir)
		if err != nil || st.Rebalance == nil || st.Rebalance.Seq != seq {
			continue
		}
		a := *st.Rebalance
		if a.Refused != "" {
			return a, fmt.Errorf("%w: %s", ErrBadScale, a.Refused)
		}
		return a, nil
	}
	return RebalanceAnswer{}, fmt.Errorf("the run in %s did not answer the rebalance request within %s (%s)", dir, rebalanceAnswerWait,
		filepath.Join(dir, ScaleStatusFile))
}

// rebalance answers the rebalance request seq: it measures, decides,
// asks the chief for the new weights (a request of its own, which poll
// then skips) and writes the answer. Call with pollMu held.
func (sc *scaler) rebalance(seq int64) {
	a := sc.s.planRebalance()
	a.Seq = seq
	if a.Refused == "" {
		next, err := writeScaleRequestSeq(sc.s.c.Dir, chief.ScaleRequest{PSWeights: a.Weights, Imbalance: a.Imbalance})
		if err != nil {
			a.Refused = "could not write the request for the chief: " + err.Error()
		} else {
			sc.seq = next
		}
	}
	if a.Refused != "" {
		sc.s.c.Log.Info("rebalance refused", "why", a.Refused)
	} else {
		sc.s.c.Log.Info("rebalancing the parameter servers: the chief moves rows once every shard is held", "weights", a.Weights,
			"imbalance", fmt.Sprintf("%.2f", a.Imbalance), "loads", a.Loads)
	}
	sc.mu.Lock()
	sc.answer = &a
	sc.mu.Unlock()
	sc.writeStatus()
}

// planRebalance measures the shards' load and decides the rebalance
// (Refused: why not).
func (s *supervisor) planRebalance() RebalanceAnswer {
	if why := rebalanceRefusal(s.c.Run); why != "" {
		return RebalanceAnswer{Refused: why}
	}
	s.mu.Lock()
	mon := s.mon
	s.mu.Unlock()
	if mon == nil {
		return RebalanceAnswer{Refused: "the launcher has not measured the parameter servers yet"}
	}
	measured, err := mon.PSLoads(RebalanceWindow)
	if err != nil {
		return RebalanceAnswer{Refused: fmt.Sprintf("%v: %v", partition.ErrUnmeasured, err)}
	}
	loads, err := layoutLoads(measured, s.psScale.count())
	if err != nil {
		return RebalanceAnswer{Refused: err.Error()}
	}
	a := RebalanceAnswer{Loads: partition.DescribeLoads(loads)}
	r, err := partition.PlanRebalance(loads, partition.MinImbalance)
	if err != nil {
		a.Refused = err.Error()
		return a
	}
	a.Weights, a.Imbalance = r.Weights, r.Imbalance
	return a
}

// layoutLoads is the loads of ps/0..ps/n-1 in measured, n the PS count
// asked for. It refuses while another number of PS holds parameters: a
// change of the count is under way, which the chief would refuse to
// rebalance once the weights reached it, with nobody told.
func layoutLoads(measured []bottleneck.PSLoad, n int) ([]partition.Load, error) {
	out := make([]partition.Load, n)
	found, holding := 0, 0
	for _, m := range measured {
		idx, ok := strings.CutPrefix(m.Task, "ps/")
		i, err := strconv.Atoi(idx)
		if !ok || err != nil || i < 0 {
			continue
		}
		if m.Params > 0 {
			holding++
		}
		if i >= n {
			continue
		}
		out[i] = partition.Load{Params: m.Params, Pushes: m.Pushes, Seconds: m.Seconds}
		found++
	}
	if holding != n {
		return nil, fmt.Errorf("%d parameter servers are up holding parameters where %d are asked for: a change of the PS count is under way, or one is down; ask again once it is done", holding, n)
	}
	if found != n {
		return nil, fmt.Errorf("the launcher measures the parameter servers it started at launch; %d of the %d holding the model now are among them", found, n)
	}
	return out, nil
}
