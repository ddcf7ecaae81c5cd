// Package metrics holds pstrain's Prometheus instrumentation: the registry
// every pstrain process (chief, ps, worker) exposes, the typed metric sets of
// each role, the HTTP server that serves them, and a scrape client that reads
// them back.
//
// # Registries
//
// Nothing in this package uses the global Prometheus registry, and the package
// has no mutable package-level state: every metric lives on a registry handed
// in by the caller, so several shards (for example three parameter servers in
// one test process) can run side by side. [NewRegistry] returns a fresh
// registry that already carries the standard process and Go runtime
// collectors, a [HostCollector] for host load, CPU and memory read from /proc
// through github.com/prometheus/procfs, and pstrain_build_info.
//
// # Role metric sets
//
// [NewWorker], [NewPS] and [NewChief] create and register the metrics of one
// role on a [prometheus.Registerer] and return a struct whose exported fields
// are the metrics themselves. Each constructor registers its metrics exactly
// once: calling it twice on the same registry panics (as
// [prometheus.Registerer.MustRegister] does), calling it on two registries is
// fine. [PS] and [Chief] both export pstrain_global_step, so a parameter server
// and the chief need separate registries even when they share a process. A
// nil Registerer creates the metrics without registering them.
//
// All durations are in seconds and all sizes in bytes. Latency histograms use
// [LatencyBuckets], which start at 100µs so that loopback RPCs still land in
// distinct buckets.
//
// # Serving and scraping
//
// [Server] serves /metrics (the Prometheus exposition of one gatherer) and
// /healthz (200 "ok" or 503 with the error of a health function) and nothing
// else; in particular net/http/pprof is never mounted. [Scrape] fetches a
// /metrics endpoint and parses it into [Families], whose accessors ([Families.Value],
// [Families.Sum], [Families.Series], [Families.Histogram]) are what pstrain's
// own tools (pstrain top, the launcher) use to read other processes' metrics.
// [Gather] does the same for an in-process gatherer without HTTP.
package metrics
