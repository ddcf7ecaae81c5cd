package sweep

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/pstrain/pstrain/observe/metrics"
	"github.com/pstrain/pstrain/observe/report"
)

// Sample is one process's resource use at one instant of a run, read from
// its /metrics endpoint.
type Sample struct {
	Seconds    float64 // since the run's process started
	Task       string  // e.g. "ps/0"
	Role       string  // chief, ps or worker
	CPUSeconds float64 // process_cpu_seconds_total
	RSSBytes   float64 // process_resident_memory_bytes
	Load1      float64 // pstrain_host_load1 (NaN if not exported)
}

// target is one file_sd entry.
type target struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// readTargets reads a Prometheus file_sd JSON file.
func readTargets(path string) ([]target, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ts []target
	if err := json.Unmarshal(b, &ts); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts, nil
}

// ScrapeFunc fetches and parses one /metrics URL (metrics.Scrape).
type ScrapeFunc func(ctx context.Context, url string) (metrics.Families, error)

// sampler polls a file_sd file and scrapes every target it lists.
type sampler struct {
	targetsPath string
	every       time.Duration
	scrape      ScrapeFunc
	now         func() time.Time
}

// run samples until ctx is done and returns the samples taken. Targets that
// do not answer (not started yet, or gone) are skipped for that tick.
func (s sampler) run(ctx context.Context, start time.Time) []Sample {
	var out []Sample
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		out = append(out, s.once(ctx, start)...)
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

func (s sampler) once(ctx context.Context, start time.Time) []Sample {
	ts, err := readTargets(s.targetsPath)
	if err != nil {
		return nil
	}
	secs := s.now().Sub(start).Seconds()
	var out []Sample
	for _, t := range ts {
		for _, addr := range t.Targets {
			sctx, cancel := context.WithTimeout(ctx, s.every)
			fams, err := s.scrape(sctx, "http://"+addr+"/metrics")
			cancel()
			if err != nil {
				continue
			}
			smp := Sample{Seconds: secs, Task: t.Labels["task"], Role: t.Labels["role"], Load1: math.NaN(),
				CPUSeconds: math.NaN(), RSSBytes: math.NaN()}
			if v, ok := fams.Value("process_cpu_seconds_total", nil); ok {
				smp.CPUSeconds = v
			}
			if v, ok := fams.Value("process_resident_memory_bytes", nil); ok {
				smp.RSSBytes = v
			}
			if v, ok := fams.Value("pstrain_host_load1", nil); ok {
				smp.Load1 = v
			}
			out = append(out, smp)
		}
	}
	return out
}

func samplesHeader() []string {
	return []string{"seconds", "task", "role", "cpu_seconds", "rss_bytes", "load1"}
}

// WriteSamples writes samples as CSV with a header.
func WriteSamples(w io.Writer, samples []Sample) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(samplesHeader()); err != nil {
		return err
	}
	for _, s := range samples {
		if err := cw.Write([]string{fmtFloat(s.Seconds), s.Task, s.Role, fmtFloat(s.CPUSeconds), fmtFloat(s.RSSBytes), fmtFloat(s.Load1)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// ReadSamples parses what WriteSamples wrote.
func ReadSamples(r io.Reader) ([]Sample, error) {
	recs, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("samples: %w", err)
	}
	if len(recs) == 0 || len(recs[0]) != len(samplesHeader()) || recs[0][0] != "seconds" {
		return nil, fmt.Errorf("samples: missing or unexpected header")
	}
	out := make([]Sample, 0, len(recs)-1)
	for i, rec := range recs[1:] {
		var s Sample
		var vals [4]float64
		for j, idx := range []int{0, 3, 4, 5} {
			if vals[j], err = parseFloat(rec[idx]); err != nil {
				return nil, fmt.Errorf("samples: line %d: %w", i+2, err)
			}
		}
		s.Seconds, s.Task, s.Role, s.CPUSeconds, s.RSSBytes, s.Load1 = vals[0], rec[1], rec[2], vals[1], vals[2], vals[3]
		out = append(out, s)
	}
	return out, nil
}

// ReadRunSamples reads runs/ID/samples.csv of the sweep in dir.
func ReadRunSamples(dir, id string) ([]Sample, error) {
	f, err := os.Open(filepath.Join(RunDir(dir, id), SamplesFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadSamples(f)
}

// ReadRunReport reads runs/ID/report.json of the sweep in dir.
func ReadRunReport(dir, id string) (*report.Report, error) {
	return report.Read(filepath.Join(RunDir(dir, id), ReportFile))
}
