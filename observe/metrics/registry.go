package metrics

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// NewRegistry returns a fresh registry carrying what every pstrain process
// exposes regardless of its role:
//
//   - the process collector (process_* metrics: CPU, memory, file descriptors),
//   - the Go runtime collector (go_* metrics),
//   - a [HostCollector] on [DefaultProcRoot] (pstrain_host_* metrics), left out
//     on systems without a proc filesystem,
//   - pstrain_build_info{version, goversion}, always 1.
//
// version is the pstrain version string; an empty one is reported as
// "unknown". Role metrics are added with [NewWorker], [NewPS] or [NewChief].
func NewRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
		newBuildInfo(version),
	)
	if host, err := NewHostCollector(DefaultProcRoot); err == nil {
		reg.MustRegister(host)
	}
	return reg
}

// newBuildInfo returns the pstrain_build_info gauge, set to 1.
func newBuildInfo(version string) prometheus.Gauge {
	if version == "" {
		version = "unknown"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricBuildInfo,
		Help: "Always 1; the labels give the pstrain version and the Go toolchain that built this process.",
		ConstLabels: prometheus.Labels{
			LabelVersion:   version,
			LabelGoVersion: runtime.Version(),
		},
	})
	g.Set(1)
	return g
}
