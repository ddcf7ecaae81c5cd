// Package preflight checks a run against the machine before any process
// starts, so that a mistake is one clear error at once rather than a
// cluster that starts and dies, is restarted, and dies again: the memory
// the model, the batches and the data need against what the machine has,
// ports in range, timeouts that are positive, two names for the same
// listening address, and (with ml/dataset.Inspect) the data files.
//
// The checks are pure functions of their arguments except MemAvailable,
// which reads /proc/meminfo under a root the caller gives.
package preflight

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/dataset"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
)

const f32 = 4 // bytes per parameter, activation and pixel

// Footprint is the memory each process of a run needs at least, in
// bytes: a lower bound (what it must hold, not what allocators and
// runtimes add), so that a run refused by it could never have run.
// float64, so that absurd sizes do not overflow.
type Footprint struct {
	Chief  float64 // its copy of the model, the initial weights and the test set
	PS     float64 // one shard: its parameters, optimizer state and a gradient
	Worker float64 // the model and its gradient, the batch's activations, the data set
}

// Estimate is the footprint of run r's model spec on data of shape d
// (of a CTR model: d.Dim dense fields and d.Classes categorical ones).
// A CTR model's shards also hold its tables' pre-filled rows
// (--embedding-prefill; the rows the data creates depend on what its
// admission and eviction keep, and are not counted), and its workers and
// chief hold their samples' dense values and keys (32 bits a key at
// least) rather than images.
func Estimate(r config.Run, spec model.Spec, d dataset.Shape) Footprint {
	params, units := float64(spec.NumParams()), 0.0 // weights and biases; activations per sample
	for _, l := range spec.ConvLayers() {
		// A CNN block holds its im2col patches, its output and the pooled map.
		units += float64(l.OutH*l.OutW) * float64(l.K()+l.Out)
		units += float64(l.PoolH * l.PoolW * l.Out)
	}
	first := spec.Input
	if spec.IsCTR() {
		first = spec.Features()
	}
	for _, n := range append(append([]int{first}, spec.Hidden...), spec.Classes) {
		units += float64(n)
	}
	// The chief's test set and a worker's data: every image, or a CTR
	// worker's share of the samples; and a shard's pre-filled rows.
	testData, workerData, rows := float64(d.TestN)*float64(d.Dim)*f32, float64(d.TrainN+d.TestN)*float64(d.Dim)*f32, 0.0
	if spec.IsCTR() {
		sample := float64(spec.Input)*f32 + float64(spec.Fields)*4 + 1 // dense values, keys, the label
		testData, workerData = float64(d.TestN)*sample, float64(d.TrainN)*r.DataFraction/float64(max(1, r.Workers))*sample
		rule := r.EmbeddingRule()
		for _, t := range spec.Tables() {
			rows += float64(r.EmbeddingPrefill) * float64(embed.RowBytes(embed.TableConfig{Dim: t.Dim, Rule: rule}))
		}
	}
	slots := float64(len(shardckpt.SlotNames(r.Optimizer)))
	shards := float64(max(1, r.PS))
	return Footprint{
		Chief:  2*params*f32 + testData,
		PS:     ((2+slots)*params*f32 + rows) / shards,
		Worker: 2*params*f32 + 2*float64(r.Batch)*units*f32 + workerData,
	}
}

// Fewer names the flags that would make run r need less memory, for
// CheckMemory's error.
func Fewer(r config.Run) string {
	if r.EmbeddingPrefill > 0 {
		return "fewer --embedding-prefill rows, or a smaller --hidden or --batch,"
	}
	return "a smaller --hidden or --batch"
}

// Run is the memory of a whole local cluster (`pstrain run`): the chief,
// every shard and every worker.
func (f Footprint) Run(r config.Run) float64 {
	return f.Chief + float64(r.PS)*f.PS + float64(r.Workers)*f.Worker
}

// CheckMemory says, if need bytes are more than avail, what needs them,
// how much there is and what would need less (fewer: Fewer's). what
// names the need ("the run (chief, 2 PS, 2 workers)").
func CheckMemory(what string, need float64, avail uint64, fewer string) error {
	if need <= float64(avail) {
		return nil
	}
	return fmt.Errorf("%s needs at least %s of memory, but this machine has %s available (MemAvailable + SwapFree in /proc/meminfo); %s needs less",
		what, Bytes(need), Bytes(float64(avail)), fewer)
}

// Bytes renders a byte count for people: "1.5 GiB (1610612736 bytes)".
func Bytes(b float64) string {
	units := []string{"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, u := b, 0
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if u == 0 {
		return fmt.Sprintf("%.0f bytes", b)
	}
	return fmt.Sprintf("%.1f %s (%.0f bytes)", v, units[u], b)
}

// MemAvailable is the memory this machine can give new processes without
// swapping, plus free swap: MemAvailable + SwapFree of the proc
// filesystem at procRoot ("/proc").
func MemAvailable(procRoot string) (uint64, error) {
	fs, err := procfs.NewFS(procRoot)
	if err != nil {
		return 0, err
	}
	mi, err := fs.Meminfo()
	if err != nil {
		return 0, err
	}
	if mi.MemAvailableBytes == nil {
		return 0, fmt.Errorf("%s/meminfo has no MemAvailable", procRoot)
	}
	avail := *mi.MemAvailableBytes
	if mi.SwapFreeBytes != nil {
		avail += *mi.SwapFreeBytes
	}
	return avail, nil
}

// CheckPortRange says, if the n ports from base on are not all valid TCP
// ports (1-65535), which flag is wrong and what would fit. base 0 means
// ports picked by the system and is always fine.
func CheckPortRange(flag string, base, n int) error {
	switch {
	case base == 0:
		return nil
	case base < 0 || base > 65535:
		return fmt.Errorf("%s %d is not a port (1-65535)", flag, base)
	case base+n-1 > 65535:
		return fmt.Errorf("%s %d: the run needs %d ports from it, up to %d, past the last port 65535 (use at most %d)",
			flag, base, n, base+n-1, 65535-n+1)
	}
	return nil
}

// Positive says, if d is not positive, that flag must be.
func Positive(flag string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s must be > 0, got %v", flag, d)
	}
	return nil
}

// Addr is an address a task listens on or is reached at, named for the
// error message ("ps/0", "ps/0 metrics").
type Addr struct {
	Name, Addr string
}

// CheckAddrs checks that each address is host:port with a port in range
// (0, "any free port", only where allowZero), and that no two are the
// same listener: the same port on the same host, where "localhost",
// 127.0.0.1 and ::1 are one host, IP addresses are compared as IPs
// (::ffff:127.0.0.1 is 127.0.0.1), host names case-insensitively, and an
// empty or unspecified host (":17001", "0.0.0.0:17001", "[::]:17001")
// takes the port on every host of the machine.
func CheckAddrs(addrs []Addr, allowZero bool) error {
	type key struct {
		host string
		port int
	}
	seen := map[key]Addr{}
	for _, a := range addrs {
		host, port, err := splitAddr(a.Addr)
		if err != nil {
			return fmt.Errorf("%s address %q: %w", a.Name, a.Addr, err)
		}
		if port == 0 && !allowZero {
			return fmt.Errorf("%s address %q: port 0 (any free port) cannot be dialled; give a port", a.Name, a.Addr)
		}
		if port == 0 {
			continue
		}
		for k, other := range seen {
			if k.port == port && (k.host == host || k.host == anyHost || host == anyHost) {
				return fmt.Errorf("%s (%s) and %s (%s) are the same address", other.Name, other.Addr, a.Name, a.Addr)
			}
		}
		seen[key{host, port}] = a
	}
	return nil
}

// anyHost stands for an empty or unspecified host: every interface.
const anyHost = "*"

// splitAddr splits host:port and canonicalises the host for comparison.
func splitAddr(addr string) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err = strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q is not a number in 0-65535", p)
	}
	return canonicalHost(h), port, nil
}

func canonicalHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "localhost" {
		return "loopback"
	}
	ip := net.ParseIP(h)
	switch {
	case h == "" || (ip != nil && ip.IsUnspecified()):
		return anyHost
	case ip != nil && (ip.Equal(net.IPv4(127, 0, 0, 1)) || ip.Equal(net.IPv6loopback)):
		return "loopback"
	case ip != nil:
		return ip.String()
	}
	return h
}
