package bench

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/ml/nn"
	"github.com/pstrain/pstrain/observe/metrics"
)

// MetricsOverheadResult is what serving and scraping the metrics costs
// training: 1 PS + 1 worker (TCP data plane, sync, in this process) with
// every process's registry served over HTTP and scraped every
// ScrapeEverySeconds, against the same cluster with nothing served or
// scraped, in alternating rounds. The instrumentation calls themselves
// (histogram observations, counter increments) run in both: pstrain has
// no build without them.
type MetricsOverheadResult struct {
	Batch                  int     `json:"batch"`
	ScrapeEverySeconds     float64 `json:"scrape_every_seconds"`
	Scrapes                int     `json:"scrapes"`
	OnSamplesPerSecond     float64 `json:"on_samples_per_second"`
	OffSamplesPerSecond    float64 `json:"off_samples_per_second"`
	Overhead               float64 `json:"overhead"` // 1 - on/off; the goal is < 0.02
	ScrapeMillisecondsMean float64 `json:"scrape_ms_mean"`
}

// MetricsOverhead measures it. Scraping every 250 ms (less with a tiny
// budget) is four times the rate of `pstrain run`'s monitor and of the
// Prometheus config here, so the figure is an upper bound.
func MetricsOverhead(ctx context.Context, c OverheadConfig) (*MetricsOverheadResult, error) {
	if err := checkDurations(c.Budget, c.Rounds); err != nil {
		return nil, err
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	every := min(250*time.Millisecond, c.Budget/4) // several scrapes per round even in tests
	run := pairRun(c.Spec, c.Batch, c.Seed)
	data := newSynthBatches(c.Spec, 2048, c.Seed)
	net, err := nn.New(c.Spec, c.Batch, true)
	if err != nil {
		return nil, err
	}
	defer net.Close()

	off, err := startTCPCluster(ctx, run, c.Spec, 0)
	if err != nil {
		return nil, err
	}
	defer off.Close()
	// The "on" cluster: a registry per process (the PS's and the
	// worker's), each with the process, Go and host collectors, served
	// on loopback and scraped over HTTP like Prometheus does.
	psReg := metrics.NewRegistry("bench")
	on, err := startTCPClusterWith(ctx, run, c.Spec, 0, func(int) *metrics.PS { return metrics.NewPS(psReg) })
	if err != nil {
		return nil, err
	}
	defer on.Close()
	workerReg := metrics.NewRegistry("bench")
	wm := metrics.NewWorker(workerReg)
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var urls []string
	for _, reg := range []*prometheus.Registry{psReg, workerReg} {
		srv := metrics.NewServer(reg, nil, slog.New(slog.DiscardHandler))
		if err := srv.Start(sctx, "127.0.0.1:0"); err != nil {
			stop()
			return nil, err
		}
		defer srv.Close()
		urls = append(urls, srv.URL()+metrics.MetricsPath)
	}
	var scrapeMu sync.Mutex
	var scrapes int
	var scrapeTime time.Duration
	scraping := make(chan bool, 1) // true while the "on" cluster trains
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		active := false
		for {
			select {
			case <-sctx.Done():
				return
			case active = <-scraping:
			case <-t.C:
				if !active {
					continue
				}
				for _, u := range urls {
					t0 := time.Now()
					if _, err := metrics.Scrape(sctx, u); err == nil {
						scrapeMu.Lock()
						scrapes++
						scrapeTime += time.Since(t0)
						scrapeMu.Unlock()
					}
				}
			}
		}
	}()
	defer func() { stop(); wg.Wait() }()

	var onBest, offBest psRound
	for range c.Rounds {
		r, err := psStepsWith(ctx, c.Now, off, run, net, data, c.Budget, nil)
		if err != nil {
			return nil, err
		}
		if r.stepsPerSec() > offBest.stepsPerSec() {
			offBest = r
		}
		scraping <- true
		r, err = psStepsWith(ctx, c.Now, on, run, net, data, c.Budget, wm)
		scraping <- false
		if err != nil {
			return nil, err
		}
		if r.stepsPerSec() > onBest.stepsPerSec() {
			onBest = r
		}
	}
	res := &MetricsOverheadResult{Batch: c.Batch, ScrapeEverySeconds: every.Seconds(),
		OnSamplesPerSecond: onBest.stepsPerSec() * float64(c.Batch), OffSamplesPerSecond: offBest.stepsPerSec() * float64(c.Batch)}
	if res.OffSamplesPerSecond > 0 {
		res.Overhead = 1 - res.OnSamplesPerSecond/res.OffSamplesPerSecond
	}
	scrapeMu.Lock()
	res.Scrapes = scrapes
	if scrapes > 0 {
		res.ScrapeMillisecondsMean = scrapeTime.Seconds() * 1e3 / float64(scrapes)
	}
	scrapeMu.Unlock()
	if res.Scrapes == 0 {
		return res, fmt.Errorf("bench: metrics overhead: no scrape happened during %d rounds of %v", c.Rounds, c.Budget)
	}
	return res, nil
}
