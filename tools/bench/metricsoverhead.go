package bench

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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
// Prometheus config here, so the figure is an upper bound. An "on" round
// trains for its budget and, past it, until a scrape has finished during
// the round (a scrape can outlast a tiny budget, as under the race
// detector); a scrape still running when the round's training stops is
// finished before the next round, so none overlaps an "off" round.
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
	defer stop()
	var urls []string
	for _, reg := range []*prometheus.Registry{psReg, workerReg} {
		srv := metrics.NewServer(reg, nil, slog.New(slog.DiscardHandler))
		if err := srv.Start(sctx, "127.0.0.1:0"); err != nil {
			return nil, err
		}
		defer srv.Close()
		urls = append(urls, srv.URL()+metrics.MetricsPath)
	}
	sc := newScraper(urls, every)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); sc.run(sctx) }()
	defer func() { stop(); wg.Wait() }()

	var onBest, offBest psRound
	for range c.Rounds {
		r, err := psStepsWith(ctx, c.Now, off, run, net, data, psWindow{budget: c.Budget})
		if err != nil {
			return nil, err
		}
		if r.stepsPerSec() > offBest.stepsPerSec() {
			offBest = r
		}
		if r, err = sc.round(sctx, func(scraped func() bool) (psRound, error) {
			return psStepsWith(ctx, c.Now, on, run, net, data, psWindow{budget: c.Budget, metrics: wm, until: scraped})
		}); err != nil {
			return nil, err
		}
		if r.stepsPerSec() > onBest.stepsPerSec() {
			onBest = r
		}
	}
	return metricsOverheadResult(c, every, onBest, offBest, sc)
}

func metricsOverheadResult(c OverheadConfig, every time.Duration, onBest, offBest psRound, sc *scraper) (*MetricsOverheadResult, error) {
	res := &MetricsOverheadResult{Batch: c.Batch, ScrapeEverySeconds: every.Seconds(),
		OnSamplesPerSecond: onBest.stepsPerSec() * float64(c.Batch), OffSamplesPerSecond: offBest.stepsPerSec() * float64(c.Batch)}
	if res.OffSamplesPerSecond > 0 {
		res.Overhead = 1 - res.OnSamplesPerSecond/res.OffSamplesPerSecond
	}
	res.Scrapes = int(sc.scrapes.Load())
	if res.Scrapes > 0 {
		res.ScrapeMillisecondsMean = float64(sc.scrapeNanos.Load()) / 1e6 / float64(res.Scrapes)
	}
	if res.Scrapes == 0 {
		return res, fmt.Errorf("bench: metrics overhead: no scrape succeeded during %d rounds of %v", c.Rounds, c.Budget)
	}
	return res, nil
}

// scraper scrapes every URL once a tick of its ticker while a round is on,
// as Prometheus would; between rounds it only lets the ticks pass.
type scraper struct {
	urls  []string
	every time.Duration
	// ctl turns rounds on (true) and off (false); run answers on ack once
	// it has taken the change, which it does only between scrapes.
	ctl chan bool
	ack chan struct{}
	// ticks counts the ticks whose scrapes have finished, successful or
	// not; scrapes and scrapeNanos the successful scrapes and their time.
	ticks, scrapes, scrapeNanos atomic.Int64
}

func newScraper(urls []string, every time.Duration) *scraper {
	return &scraper{urls: urls, every: every, ctl: make(chan bool), ack: make(chan struct{})}
}

// run scrapes until ctx ends.
func (s *scraper) run(ctx context.Context) {
	t := time.NewTicker(s.every)
	defer t.Stop()
	active := false
	for {
		select {
		case <-ctx.Done():
			return
		case active = <-s.ctl:
			select {
			case s.ack <- struct{}{}:
			case <-ctx.Done():
				return
			}
		case <-t.C:
			if active {
				s.scrapeAll(ctx)
			}
		}
	}
}

func (s *scraper) scrapeAll(ctx context.Context) {
	for _, u := range s.urls {
		t0 := time.Now()
		if _, err := metrics.Scrape(ctx, u); err == nil {
			s.scrapes.Add(1)
			s.scrapeNanos.Add(int64(time.Since(t0)))
		}
	}
	s.ticks.Add(1)
}

// round turns scraping on, runs train with a condition that holds once a
// tick's scrapes have finished during the round, and turns scraping off
// again, which waits for a scrape in progress to finish.
func (s *scraper) round(ctx context.Context, train func(scraped func() bool) (psRound, error)) (psRound, error) {
	if err := s.set(ctx, true); err != nil {
		return psRound{}, err
	}
	before := s.ticks.Load()
	r, err := train(func() bool { return s.ticks.Load() > before })
	if serr := s.set(ctx, false); err == nil {
		err = serr
	}
	return r, err
}

// set hands run the change and waits for it to be taken.
func (s *scraper) set(ctx context.Context, on bool) error {
	select {
	case s.ctl <- on:
	case <-ctx.Done():
		return fmt.Errorf("bench: metrics overhead: scraper: %w", ctx.Err())
	}
	select {
	case <-s.ack:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bench: metrics overhead: scraper: %w", ctx.Err())
	}
}
