package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/pstrain/pstrain/observe/bottleneck"
	"github.com/pstrain/pstrain/observe/report"
)

// ClusterSetup is one cluster the cluster section measures.
type ClusterSetup struct {
	Mode    string
	PS      int
	Workers int
	// Replicas is --ps-replicas: 1 gives every shard a hot standby
	// (docs/replication.md).
	Replicas int
}

// Name is the setup's key in the JSON ("sync-2ps-2w", "sync-2ps-2w-r1"
// with hot standbys).
func (s ClusterSetup) Name() string {
	n := fmt.Sprintf("%s-%dps-%dw", s.Mode, s.PS, s.Workers)
	if s.Replicas > 0 {
		n += fmt.Sprintf("-r%d", s.Replicas)
	}
	return n
}

// ClusterSetups are the clusters measured: the default one (sync, 2 PS,
// 2 workers, whose efficiency is the headline), the same async, 1 PS + 1
// worker, and the first two with hot standbys (what replication costs).
func ClusterSetups() []ClusterSetup {
	return []ClusterSetup{{"sync", 2, 2, 0}, {"async", 2, 2, 0}, {"sync", 1, 1, 0}, {"sync", 2, 2, 1}, {"async", 2, 2, 1}}
}

// ClusterPlan says how long the two runs of each setup train: the
// difference between them is the measured stretch.
type ClusterPlan struct {
	Setups      []ClusterSetup
	Batch       int // per worker, passed to every run; the ceiling's batch
	ShortEpochs float64
	LongEpochs  float64
}

// ClusterPlanFor is the plan of a full or a quick bench run.
func ClusterPlanFor(quick bool) ClusterPlan {
	if quick {
		return ClusterPlan{Setups: ClusterSetups(), Batch: 128, ShortEpochs: 0.25, LongEpochs: 0.75}
	}
	return ClusterPlan{Setups: ClusterSetups(), Batch: 128, ShortEpochs: 0.5, LongEpochs: 2}
}

// ClusterRun is one setup's figures. SamplesPerSecond is the steady rate:
// the samples the long run trained beyond the short one over the extra
// training time they took, so start-up, the first steps (connections,
// first-touch allocations) and the chief's end-of-run poll, which both
// runs have, cancel out.
type ClusterRun struct {
	Name             string  `json:"name"`
	Mode             string  `json:"mode"`
	PS               int     `json:"ps"`
	Workers          int     `json:"workers"`
	Batch            int     `json:"batch"`
	ShortEpochs      float64 `json:"short_epochs"`
	LongEpochs       float64 `json:"long_epochs"`
	MeasuredSamples  int64   `json:"measured_samples"`
	MeasuredSeconds  float64 `json:"measured_seconds"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// Efficiency is SamplesPerSecond / (cores x one process's ceiling).
	Efficiency float64 `json:"efficiency"`
	// Phases and TaskCPUPercent are the long run's bottleneck breakdown
	// (the launcher's scrapes over the whole run): where a worker's step
	// time went and each task's CPU, in % of one core.
	Phases         *bottleneck.Phases `json:"phases,omitempty"`
	TaskCPUPercent map[string]float64 `json:"task_cpu_percent,omitempty"`
	Error          string             `json:"error,omitempty"`
}

// ClusterResult is the cluster section. Efficiency is the default
// cluster's (the first setup's).
type ClusterResult struct {
	Efficiency float64 `json:"efficiency"`
	Cores      int     `json:"cores"`
	Batch      int     `json:"batch"`
	// CeilingSamplesPerSecond is one process's BLAS ceiling at Batch (the
	// step's matrix products alone, one BLAS thread), measured in the same
	// bench run; MachineSamplesPerSecond is Cores times that.
	CeilingSamplesPerSecond float64      `json:"ceiling_samples_per_second"`
	MachineSamplesPerSecond float64      `json:"machine_samples_per_second"`
	Runs                    []ClusterRun `json:"runs"`
	// ReplicaThroughput is, by setup without replicas ("sync-2ps-2w"),
	// the samples/s of the same cluster with hot standbys over its own:
	// what --ps-replicas 1 keeps of the throughput.
	ReplicaThroughput map[string]float64 `json:"replica_throughput,omitempty"`
}

// Efficiency is samples/s over what cores processes each at the ceiling
// could compute (0 without a ceiling).
func Efficiency(samplesPerSecond float64, cores int, ceiling float64) float64 {
	return ratio(samplesPerSecond, float64(cores)*ceiling)
}

// ReportSamples is how many training samples a run consumed: a sync step
// aggregates ReplicasToAggregate batches, an async one is one batch.
func ReportSamples(rep *report.Report) int64 { return rep.GlobalSteps * samplesPerStep(rep) }

func samplesPerStep(rep *report.Report) int64 {
	per := int64(rep.Batch)
	if rep.Mode == "sync" {
		per *= int64(max(1, rep.ReplicasToAggregate))
	}
	return per
}

// SteadyRate is the rate over the stretch the long run trained beyond
// the short one.
func SteadyRate(short, long *report.Report) (samples int64, seconds, perSecond float64, err error) {
	samples = ReportSamples(long) - ReportSamples(short)
	seconds = long.TrainSeconds - short.TrainSeconds
	if samples <= 0 || seconds <= 0 {
		return samples, seconds, 0, fmt.Errorf("bench: the long run (%d samples in %.3f s) did not train more, for longer, than the short one (%d in %.3f s)",
			ReportSamples(long), long.TrainSeconds, ReportSamples(short), short.TrainSeconds)
	}
	return samples, seconds, float64(samples) / seconds, nil
}

// Cluster runs each setup twice through r (short, then long) and sets
// their steady rates against cores x ceiling. A failing setup is recorded
// in its row; the section fails only when the default cluster (the first
// setup) does, or ctx ends.
func Cluster(ctx context.Context, r Runner, p ClusterPlan, cores int, ceiling float64) (*ClusterResult, error) {
	if r == nil {
		return nil, errors.New("bench: cluster needs a runner")
	}
	if len(p.Setups) == 0 || p.Batch <= 0 || p.ShortEpochs <= 0 || p.LongEpochs <= p.ShortEpochs {
		return nil, fmt.Errorf("bench: bad cluster plan %+v", p)
	}
	res := &ClusterResult{Cores: cores, Batch: p.Batch, CeilingSamplesPerSecond: ceiling,
		MachineSamplesPerSecond: float64(cores) * ceiling}
	for i, s := range p.Setups {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		row := clusterSetup(ctx, r, p, s, cores, ceiling)
		if i == 0 {
			if row.Error != "" {
				return nil, fmt.Errorf("bench: default cluster %s: %s", s.Name(), row.Error)
			}
			res.Efficiency = row.Efficiency
		}
		res.Runs = append(res.Runs, row)
	}
	res.ReplicaThroughput = replicaThroughput(p.Setups, res.Runs)
	return res, nil
}

// replicaThroughput pairs each setup with hot standbys with the same one
// without and gives the ratio of their rates.
func replicaThroughput(setups []ClusterSetup, runs []ClusterRun) map[string]float64 {
	rate := map[ClusterSetup]float64{}
	for i, s := range setups {
		if runs[i].Error == "" {
			rate[s] = runs[i].SamplesPerSecond
		}
	}
	var out map[string]float64
	for s, r := range rate {
		base := s
		base.Replicas = 0
		if b, ok := rate[base]; ok && s.Replicas > 0 && b > 0 {
			if out == nil {
				out = map[string]float64{}
			}
			out[base.Name()] = r / b
		}
	}
	return out
}

func clusterSetup(ctx context.Context, r Runner, p ClusterPlan, s ClusterSetup, cores int, ceiling float64) ClusterRun {
	row := ClusterRun{Name: s.Name(), Mode: s.Mode, PS: s.PS, Workers: s.Workers, Batch: p.Batch,
		ShortEpochs: p.ShortEpochs, LongEpochs: p.LongEpochs}
	args := func(epochs float64) []string {
		a := append(GridArgs(s.Mode, s.PS, s.Workers, epochs), "--batch", fmt.Sprint(p.Batch))
		if s.Replicas > 0 {
			a = append(a, "--ps-replicas", fmt.Sprint(s.Replicas))
		}
		return a
	}
	short, _, err := r.Run(ctx, args(p.ShortEpochs))
	if err != nil {
		row.Error = err.Error()
		return row
	}
	long, _, err := r.Run(ctx, args(p.LongEpochs))
	if err != nil {
		row.Error = err.Error()
		return row
	}
	if row.MeasuredSamples, row.MeasuredSeconds, row.SamplesPerSecond, err = SteadyRate(short, long); err != nil {
		row.Error = err.Error()
		return row
	}
	row.Efficiency = Efficiency(row.SamplesPerSecond, cores, ceiling)
	if b := long.Bottleneck; b != nil {
		row.Phases = b.Phases
		for _, t := range b.Tasks {
			if t.CPUPercent != nil {
				if row.TaskCPUPercent == nil {
					row.TaskCPUPercent = map[string]float64{}
				}
				row.TaskCPUPercent[t.Task] = *t.CPUPercent
			}
		}
	}
	return row
}

// TimeToTargetOverIdeal is the time to the target over the ideal time for
// the samples trained until then: samples / (cores x ceiling). Nil when
// the target was not reached or there is no ceiling.
func TimeToTargetOverIdeal(timeToTarget *float64, samples int64, cores int, ceiling float64) (ideal float64, over *float64) {
	if cores <= 0 || ceiling <= 0 {
		return 0, nil
	}
	ideal = float64(samples) / (float64(cores) * ceiling)
	if timeToTarget == nil || ideal <= 0 {
		return ideal, nil
	}
	v := *timeToTarget / ideal
	return ideal, &v
}

// SamplesToTarget is the samples a run had trained when it reached its
// target: the step of the evaluation that held it (the one at
// TimeToTargetSeconds) times the samples per step. Without a target it is
// every sample the run consumed.
func SamplesToTarget(rep *report.Report) int64 {
	if rep.TimeToTargetSeconds != nil {
		for _, e := range rep.Evals {
			if e.Seconds == *rep.TimeToTargetSeconds && !e.Subset {
				return e.Step * samplesPerStep(rep)
			}
		}
	}
	return ReportSamples(rep)
}

// Ceiling measures one process's BLAS ceiling in samples/s at batch: the
// step's matrix products alone on c.BLAS, best of c.Rounds loops.
func Ceiling(ctx context.Context, c ComputeConfig, batch int) (float64, error) {
	if c.BLAS == nil {
		return 0, errors.New("bench: the ceiling needs a BLAS")
	}
	if err := checkDurations(c.Budget, c.Rounds); err != nil {
		return 0, err
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	prods, err := Products(c.Spec, batch)
	if err != nil {
		return 0, err
	}
	gemms := newGemmBuffers(prods, rand.New(rand.NewPCG(c.Seed, uint64(batch))))
	gemms.run(c.BLAS) // warm-up
	var b best
	for range c.Rounds {
		n, d, err := loop(ctx, c.Now, c.Budget, 2, func() error { gemms.run(c.BLAS); return nil })
		if err != nil {
			return 0, fmt.Errorf("bench: ceiling batch %d: %w", batch, err)
		}
		b.add(rate(float64(n), d))
	}
	return float64(b) * float64(batch), nil
}

// ceilingFor is the ceiling at batch: the compute section's if it measured
// that batch, else measured now.
func ceilingFor(ctx context.Context, c ComputeConfig, compute *ComputeResult, batch int) (float64, error) {
	if compute != nil {
		for _, b := range compute.Batches {
			if b.Batch == batch && b.CeilingSamplesPerSecond > 0 {
				return b.CeilingSamplesPerSecond, nil
			}
		}
	}
	return Ceiling(ctx, c, batch)
}
