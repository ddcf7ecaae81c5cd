package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
)

// DefaultProcRoot is where the proc filesystem is mounted on Linux.
const DefaultProcRoot = "/proc"

// cpuModes are the values of the mode label of pstrain_host_cpu_seconds_total,
// in exposition order.
var cpuModes = [...]string{"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"}

// HostCollector is a [prometheus.Collector] for host-wide load, CPU time and
// memory, read through github.com/prometheus/procfs on every collection. It
// exports
//
//	pstrain_host_load1, pstrain_host_load5, pstrain_host_load15  gauges
//	pstrain_host_cpus                                            gauge
//	pstrain_host_cpu_seconds_total{mode}                         counter
//	pstrain_host_memory_total_bytes                              gauge
//	pstrain_host_memory_available_bytes                          gauge
//
// A file that cannot be read or parsed turns into a collection error for the
// metrics that come from it; the other metrics are still collected. The
// available-memory gauge is left out on kernels whose meminfo has no
// MemAvailable line.
type HostCollector struct {
	root string
	fs   procfs.FS

	load1, load5, load15 *prometheus.Desc
	cpus, cpuSeconds     *prometheus.Desc
	memTotal, memAvail   *prometheus.Desc
}

// NewHostCollector returns a HostCollector reading the proc filesystem mounted
// at procRoot ([DefaultProcRoot] in production, a fixture directory in
// tests). It fails if procRoot is not a readable directory.
func NewHostCollector(procRoot string) (*HostCollector, error) {
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return nil, fmt.Errorf("metrics: host collector: %w", err)
	}
	return &HostCollector{
		root: procRoot,
		fs:   fs,
		load1: prometheus.NewDesc(MetricHostLoad1,
			"Host load average over the last minute (runnable plus uninterruptible tasks).", nil, nil),
		load5: prometheus.NewDesc(MetricHostLoad5,
			"Host load average over the last 5 minutes.", nil, nil),
		load15: prometheus.NewDesc(MetricHostLoad15,
			"Host load average over the last 15 minutes.", nil, nil),
		cpus: prometheus.NewDesc(MetricHostCPUs,
			"Number of CPUs of the host, counted from the per-CPU lines of /proc/stat.", nil, nil),
		cpuSeconds: prometheus.NewDesc(MetricHostCPUSeconds,
			"CPU time the host spent in each mode, summed over all CPUs, in seconds.", []string{LabelMode}, nil),
		memTotal: prometheus.NewDesc(MetricHostMemoryTotalBytes,
			"Total usable memory of the host (MemTotal), in bytes.", nil, nil),
		memAvail: prometheus.NewDesc(MetricHostMemoryAvailableBytes,
			"Memory of the host available for new work without swapping (MemAvailable), in bytes.", nil, nil),
	}, nil
}

// Describe implements [prometheus.Collector].
func (c *HostCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.load1, c.load5, c.load15, c.cpus, c.cpuSeconds, c.memTotal, c.memAvail} {
		ch <- d
	}
}

// Collect implements [prometheus.Collector].
func (c *HostCollector) Collect(ch chan<- prometheus.Metric) {
	c.collectLoad(ch)
	c.collectStat(ch)
	c.collectMemory(ch)
}

func (c *HostCollector) collectLoad(ch chan<- prometheus.Metric) {
	load, err := c.fs.LoadAvg()
	if err != nil {
		for _, d := range []*prometheus.Desc{c.load1, c.load5, c.load15} {
			ch <- prometheus.NewInvalidMetric(d, fmt.Errorf("reading loadavg: %w", err))
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(c.load1, prometheus.GaugeValue, load.Load1)
	ch <- prometheus.MustNewConstMetric(c.load5, prometheus.GaugeValue, load.Load5)
	ch <- prometheus.MustNewConstMetric(c.load15, prometheus.GaugeValue, load.Load15)
}

func (c *HostCollector) collectStat(ch chan<- prometheus.Metric) {
	stat, err := c.fs.Stat()
	if err != nil {
		err = fmt.Errorf("reading stat: %w", err)
		ch <- prometheus.NewInvalidMetric(c.cpus, err)
		ch <- prometheus.NewInvalidMetric(c.cpuSeconds, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.cpus, prometheus.GaugeValue, float64(len(stat.CPU)))
	t := stat.CPUTotal
	values := [len(cpuModes)]float64{t.User, t.Nice, t.System, t.Idle, t.Iowait, t.IRQ, t.SoftIRQ, t.Steal}
	for i, mode := range cpuModes {
		ch <- prometheus.MustNewConstMetric(c.cpuSeconds, prometheus.CounterValue, values[i], mode)
	}
}

func (c *HostCollector) collectMemory(ch chan<- prometheus.Metric) {
	mem, err := c.fs.Meminfo()
	if err != nil {
		err = fmt.Errorf("reading meminfo: %w", err)
		ch <- prometheus.NewInvalidMetric(c.memTotal, err)
		ch <- prometheus.NewInvalidMetric(c.memAvail, err)
		return
	}
	if mem.MemTotalBytes != nil {
		ch <- prometheus.MustNewConstMetric(c.memTotal, prometheus.GaugeValue, float64(*mem.MemTotalBytes))
	} else {
		ch <- prometheus.NewInvalidMetric(c.memTotal, fmt.Errorf("%s/meminfo has no MemTotal line", c.root))
	}
	if mem.MemAvailableBytes != nil {
		ch <- prometheus.MustNewConstMetric(c.memAvail, prometheus.GaugeValue, float64(*mem.MemAvailableBytes))
	}
}
