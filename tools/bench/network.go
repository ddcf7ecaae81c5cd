package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/pstrain/pstrain/observe/report"
)

// NetworkLink is an emulated link: every task's host gets one, with
// this capacity each way, this one-way delay and this loss towards the
// host (so two tasks talk across two such links: the round trip is
// twice the delay, and each direction crosses one lossy hop).
type NetworkLink struct {
	Name  string
	Rate  float64 // bits per second, each way
	Delay time.Duration
	Loss  float64 // fraction of frames dropped
}

// NetworkLinks are the links the network section measures.
func NetworkLinks() []NetworkLink {
	return []NetworkLink{
		{Name: "100mbit", Rate: 100e6, Delay: 5 * time.Millisecond, Loss: 0.001},
		{Name: "1gbit", Rate: 1e9, Delay: 500 * time.Microsecond},
	}
}

// NetworkModel is a model the section trains to its held target.
type NetworkModel struct {
	Name   string
	Args   []string // flags choosing it and its target
	Target float64
	// Cap bounds a run: the chief is interrupted then (it hands back its
	// model and reports no time to target).
	Cap time.Duration
}

// NetworkPlan is the network section's grid: every model over every
// link with every compression, in that nesting.
type NetworkPlan struct {
	Links    []NetworkLink
	Compress []string
	Models   []NetworkModel
	Extra    []string // flags every run gets (e.g. a data fraction)
	Runner   NetworkRunner
	// Journal is a file of finished runs, one JSON object a line: a run
	// already in it is not run again, so an interrupted section resumes
	// (empty: no journal).
	Journal  string
	Progress io.Writer
	Now      Clock
	Load     func() float64 // the host's one-minute load average (nil: not recorded)
}

// NetworkPlanFor is the full grid, or the quick one: the MLP to a
// reduced target on a fifth of MNIST, over 100 Mbit/s, with top-k.
func NetworkPlanFor(quick bool) NetworkPlan {
	if quick {
		return NetworkPlan{Links: NetworkLinks()[:1], Compress: []string{"topk:0.01"},
			Models: []NetworkModel{{Name: "mlp", Args: []string{"--target-accuracy", "0.9"}, Target: 0.9, Cap: 2 * time.Minute}},
			Extra:  []string{"--data-fraction", "0.2", "--epochs", "10"}}
	}
	return NetworkPlan{Links: NetworkLinks(), Compress: []string{"none", "topk:0.01", "topk:0.02/topk:0.04", "int8"},
		Models: []NetworkModel{
			{Name: "mlp", Args: []string{"--target-accuracy", "0.975"}, Target: 0.975, Cap: 450 * time.Second},
			{Name: "cnn", Args: []string{"--model", "cnn", "--target-accuracy", "0.99"}, Target: 0.99, Cap: 300 * time.Second},
		}}
}

// NetworkRunner runs one training of the default cluster across
// emulated links and returns the chief's report (also for a run the cap
// interrupted).
type NetworkRunner interface {
	// Kind describes the links and the cluster's layout.
	Kind() string
	Run(ctx context.Context, link NetworkLink, limit time.Duration, args []string) (*report.Report, error)
}

// NetworkRun is one run of the grid. TimeToTargetSeconds is the
// report's (null: the held target was not reached, within CapSeconds
// if StoppedBy is interrupted); TestAccuracy is the model handed back.
type NetworkRun struct {
	Link                string   `json:"link"`
	Compress            string   `json:"compress"`
	Model               string   `json:"model"`
	TimeToTargetSeconds *float64 `json:"time_to_target_seconds"`
	TestAccuracy        float64  `json:"test_accuracy"`
	TargetAccuracy      float64  `json:"target_accuracy"`
	StoppedBy           string   `json:"stopped_by,omitempty"`
	EpochsDone          float64  `json:"epochs_done"`
	TrainSeconds        float64  `json:"train_seconds"`
	SamplesPerSecond    float64  `json:"samples_per_second"`
	PushBytesPerStep    float64  `json:"push_bytes_per_step"`
	PullBytesPerStep    float64  `json:"pull_bytes_per_step"`
	CapSeconds          float64  `json:"cap_seconds"`
	// LoadAverage is the host's one-minute load average at the run's
	// end: the runs share this machine's cores with whatever else runs.
	LoadAverage float64 `json:"load_average,omitempty"`
	Error       string  `json:"error,omitempty"`
}

func (r NetworkRun) key() string { return r.Model + " " + r.Link + " " + r.Compress }

// NetworkResult is the network section.
type NetworkResult struct {
	Setup string       `json:"setup"`
	Runs  []NetworkRun `json:"runs"`
}

// Network runs the plan's grid, skipping the runs its journal holds. A
// run's failure is recorded in the run and the grid goes on; the section
// fails only if every run failed.
func Network(ctx context.Context, p NetworkPlan) (*NetworkResult, error) {
	if p.Runner == nil {
		return nil, errors.New("bench: network: no runner")
	}
	if p.Progress == nil {
		p.Progress = io.Discard
	}
	done, err := readJournal(p.Journal)
	if err != nil {
		return nil, err
	}
	res := &NetworkResult{Setup: p.Runner.Kind()}
	failed := 0
	for _, m := range p.Models {
		for _, link := range p.Links {
			for _, c := range p.Compress {
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				r := NetworkRun{Link: link.Name, Compress: c, Model: m.Name, TargetAccuracy: m.Target, CapSeconds: m.Cap.Seconds()}
				if old, ok := done[r.key()]; ok {
					fmt.Fprintf(p.Progress, "bench: network %s: from the journal (%s)\n", r.key(), old.summary())
					res.Runs = append(res.Runs, old)
					continue
				}
				r, err := p.run(ctx, link, m, r)
				if err != nil {
					return res, err // this machine cannot run the section at all
				}
				if r.Error != "" {
					failed++
				} else if err := appendJournal(p.Journal, r); err != nil {
					return res, err
				}
				res.Runs = append(res.Runs, r)
			}
		}
	}
	if failed > 0 && failed == len(res.Runs) {
		return res, fmt.Errorf("bench: network: every run failed; the first: %s", res.Runs[0].Error)
	}
	return res, nil
}

// run makes one run of the grid and says how it went; an error only
// when the runner cannot run here at all (ErrSkip).
func (p NetworkPlan) run(ctx context.Context, link NetworkLink, m NetworkModel, r NetworkRun) (NetworkRun, error) {
	now := p.Now
	if now == nil {
		now = time.Now
	}
	fmt.Fprintf(p.Progress, "bench: network %s (%g Mbit/s, %v, loss %g%%; cap %v) ...\n", r.key(), link.Rate/1e6, link.Delay, 100*link.Loss, m.Cap)
	args := append(append(append([]string{}, m.Args...), p.Extra...), "--compress", r.Compress)
	t0 := now()
	rep, err := p.Runner.Run(ctx, link, m.Cap, args)
	if errors.Is(err, ErrSkip) {
		return r, err
	}
	if err != nil {
		r.Error = err.Error()
		fmt.Fprintf(p.Progress, "bench: network %s failed after %.0f s: %v\n", r.key(), now().Sub(t0).Seconds(), err)
		return r, nil
	}
	r.TimeToTargetSeconds, r.TestAccuracy, r.StoppedBy = rep.TimeToTargetSeconds, rep.TestAccuracy, rep.StoppedBy
	r.EpochsDone, r.TrainSeconds, r.SamplesPerSecond = rep.EpochsDone, rep.TrainSeconds, rep.SamplesPerSecond
	r.PushBytesPerStep, r.PullBytesPerStep = rep.Wire.PushBytesPerStep, rep.Wire.PullBytesPerStep
	if p.Load != nil {
		r.LoadAverage = p.Load()
	}
	fmt.Fprintf(p.Progress, "bench: network %s: %s (wall %.0f s)\n", r.key(), r.summary(), now().Sub(t0).Seconds())
	return r, nil
}

func (r NetworkRun) summary() string {
	ttt := "target not held"
	if r.TimeToTargetSeconds != nil {
		ttt = fmt.Sprintf("%.1f s to %.1f%%", *r.TimeToTargetSeconds, 100*r.TargetAccuracy)
	}
	return fmt.Sprintf("%s, stopped by %s, %.2f%% handed back, %.2f epochs, load %.1f", ttt, r.StoppedBy, 100*r.TestAccuracy, r.EpochsDone, r.LoadAverage)
}

// readJournal reads the finished runs of an earlier, interrupted
// section ("" or a missing file: none).
func readJournal(path string) (map[string]NetworkRun, error) {
	done := map[string]NetworkRun{}
	if path == "" {
		return done, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return done, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bench: network journal: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var r NetworkRun
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("bench: network journal %s line %d: %w", path, n, err)
		}
		done[r.key()] = r
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: network journal: %w", err)
	}
	return done, nil
}

func appendJournal(path string, r NetworkRun) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("bench: network journal: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("bench: network journal: %w", err)
	}
	return f.Close()
}

// writeNetworkTable prints the network section.
func writeNetworkTable(w io.Writer, n *NetworkResult) {
	fmt.Fprintf(w, "\nnetwork: time to the held target across emulated links (%s)\n", n.Setup)
	fmt.Fprintln(w, "  model\tlink\tcompress\ttime to target, s\taccuracy handed back\tstopped by\tpush kB/step\tpull kB/step")
	for _, r := range n.Runs {
		ttt := "-"
		if r.TimeToTargetSeconds != nil {
			ttt = strconv.FormatFloat(*r.TimeToTargetSeconds, 'f', 1, 64)
		}
		if r.Error != "" {
			fmt.Fprintf(w, "  %s\t%s\t%s\tfailed: %s\n", r.Model, r.Link, r.Compress, r.Error)
			continue
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%.2f%%\t%s\t%.1f\t%.1f\n", r.Model, r.Link, r.Compress, ttt, 100*r.TestAccuracy,
			r.StoppedBy, r.PushBytesPerStep/1e3, r.PullBytesPerStep/1e3)
	}
}
