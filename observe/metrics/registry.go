package metrics

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// RegistryOptions configure [NewRegistryWith].
type RegistryOptions struct {
	// Version is the pstrain version ("" is reported as "unknown").
	Version string
	// Host adds a [HostCollector] on [DefaultProcRoot]: the host's load,
	// CPU time and memory. One process per host is enough: every process
	// on a host would export the same series.
	Host bool
}

// NewRegistry returns a fresh registry carrying what every pstrain process
// exposes regardless of its role, and the host's metrics:
//
//   - the process collector (process_* metrics: CPU, memory, file descriptors),
//   - the Go runtime collector (go_* metrics),
//   - a [HostCollector] on [DefaultProcRoot] (pstrain_host_* metrics), left out
//     on systems without a proc filesystem,
//   - pstrain_build_info{version, revision, goversion}, always 1.
//
// version is the pstrain version string; an empty one is reported as
// "unknown". Role metrics are added with [NewWorker], [NewPS] or [NewChief].
// It is NewRegistryWith(RegistryOptions{Version: version, Host: true}).
func NewRegistry(version string) *prometheus.Registry {
	return NewRegistryWith(RegistryOptions{Version: version, Host: true})
}

// NewRegistryWith is [NewRegistry] with the host collector only when
// o.Host is set.
func NewRegistryWith(o RegistryOptions) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
		newBuildInfo(o.Version, revision(debug.ReadBuildInfo())),
	)
	if !o.Host {
		return reg
	}
	if host, err := NewHostCollector(DefaultProcRoot); err == nil {
		reg.MustRegister(host)
	}
	return reg
}

// revision is the VCS revision the binary was built from (the build
// setting vcs.revision, which `go build` stamps in a git checkout unless
// -buildvcs=false), or "unknown".
func revision(info *debug.BuildInfo, ok bool) string {
	if ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// newBuildInfo returns the pstrain_build_info gauge, set to 1.
func newBuildInfo(version, revision string) prometheus.Gauge {
	if version == "" {
		version = "unknown"
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: MetricBuildInfo,
		Help: "Always 1; the labels give the pstrain version, the VCS revision it was built from and the Go toolchain that built this process.",
		ConstLabels: prometheus.Labels{
			LabelVersion:   version,
			LabelRevision:  revision,
			LabelGoVersion: runtime.Version(),
		},
	})
	g.Set(1)
	return g
}
