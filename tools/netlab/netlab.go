// Package netlab builds small virtual networks on one Linux machine for
// multi-host tests: a bridge, and N network namespaces ("hosts"), each
// with its own IP address in a private /24 and one link into the bridge.
// Links can be impaired (added delay, random loss), cut and healed.
//
// Everything is done with `ip` and `tc` from iproute2 and needs root.
// Every resource is named after a per-lab prefix and removed by Close;
// resources left by a lab whose process died (kill -9 of `go test`) are
// removed by the next New.
//
// Two kinds of link:
//
//   - LinkVeth (the default): a veth pair, the host end moved into the
//     namespace, the other end a port of the bridge. Impairments are
//     `tc qdisc replace ... root netem` on the bridge-side end, so every
//     packet between two hosts crosses exactly one impaired hop: a delay d
//     is a one-way delay d (round trip 2d), a loss p is per packet.
//   - LinkWire: two TAP devices (one in the namespace, one a port of the
//     bridge) joined by this process, which copies frames between them and
//     applies the delay and loss itself, on the same direction as netem
//     (towards the host). For kernels built without sch_netem (no
//     CONFIG_NET_SCH_NETEM and no loadable modules), where netem is
//     unavailable. The kernels' TCP stacks see real delay and loss all the
//     same; the frames just cross a user-space hop. The TAP MTU is 65000 so
//     that a frame copy is not the bottleneck (Config.MTU sets another).
//     Only these links can also be rate-limited (Impairment.Rate: each
//     direction its own FIFO at that rate, tail-dropping what would wait
//     longer than Impairment.Queue). The links vanish when this process
//     exits (their file descriptors close).
//
// LinkAuto picks LinkVeth when the kernel has netem and LinkWire otherwise.
package netlab

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// LinkKind says how a host is wired into the bridge.
type LinkKind int

const (
	LinkVeth LinkKind = iota // kernel veth pair; impairments via tc netem
	LinkWire                 // TAP pair forwarded by this process; impairments in Go
	LinkAuto                 // LinkVeth if the kernel has netem, else LinkWire
)

func (k LinkKind) String() string {
	switch k {
	case LinkVeth:
		return "veth+netem"
	case LinkWire:
		return "tap+userspace-netem"
	}
	return "auto"
}

// Config describes a lab.
type Config struct {
	Hosts int      // number of namespaces
	Link  LinkKind // default LinkVeth
	// MTU of LinkWire links (0: 65000, so that copying frames is not the
	// bottleneck). A smaller one (9000, as jumbo frames) makes TCP see
	// more, smaller packets on a rate-limited link, at more CPU.
	MTU int
}

// Host is one network namespace.
type Host struct {
	Index int
	NS    string // namespace name (ip netns)
	IP    string // its address, e.g. 10.77.23.10
	Link  string // the bridge-side end of its link, in the root namespace
	inner string // the namespace-side end
	wire  *wire  // LinkWire only
}

// Impairment is what netem does to the packets towards a host, and,
// with Rate, the capacity of the host's link.
type Impairment struct {
	Delay time.Duration // one-way delay added
	Loss  float64       // fraction of packets dropped, 0..1
	// Rate is the link's capacity in bits per second, each way (0: not
	// limited). LinkWire only: frames leave at that rate from a FIFO
	// that drops a frame which would wait longer than Queue for the link
	// (tail drop, as a switch port's buffer), then the delay is added.
	Rate  float64
	Queue time.Duration // 0: DefaultQueue
}

// DefaultQueue is how long a frame may wait for a rate-limited link
// before it is dropped, when Impairment.Queue is 0.
const DefaultQueue = 20 * time.Millisecond

func (im Impairment) String() string {
	s := fmt.Sprintf("delay %s, loss %.2f%%", im.Delay, 100*im.Loss)
	if im.Rate > 0 {
		s += fmt.Sprintf(", rate %g Mbit/s", im.Rate/1e6)
	}
	return s
}

// Lab is a bridge and its hosts.
type Lab struct {
	Prefix   string // unique per lab; every resource name starts with it
	Subnet   string // e.g. 10.77.23.0/24
	Bridge   string // the bridge device; it has the subnet's .1 so this process reaches every host
	BridgeIP string
	Kind     LinkKind // LinkVeth or LinkWire (never LinkAuto)
	Hosts    []*Host

	mu     sync.Mutex
	closed bool
}

// ErrNetnsRefused marks a kernel or sandbox that does not allow network
// namespaces at all (no CONFIG_NET_NS, or no CAP_SYS_ADMIN in a container).
var ErrNetnsRefused = errors.New("netlab: the kernel refuses to create network namespaces")

// Prereq reports why a lab cannot be built here: not root, or `ip` or `tc`
// missing. It returns nil when New may be tried.
func Prereq() error {
	if os.Geteuid() != 0 {
		return errors.New("netlab: network namespaces need root (run the tests as root; CI does)")
	}
	for _, b := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("netlab: %s not found in PATH: install iproute2 (scripts/setup.sh does)", b)
		}
	}
	return nil
}

var labSeq atomic.Int64

const tag = "pstrainlab"

// New builds a lab. On error, whatever was created is removed again.
func New(ctx context.Context, cfg Config) (l *Lab, err error) {
	if err := Prereq(); err != nil {
		return nil, err
	}
	if cfg.Hosts < 1 || cfg.Hosts > 200 {
		return nil, fmt.Errorf("netlab: %d hosts, want 1..200", cfg.Hosts)
	}
	SweepStale(ctx)
	seq := labSeq.Add(1)
	id := fmt.Sprintf("%04x", (uint32(os.Getpid())*31+uint32(seq)*7919+rand.Uint32())&0xffff)
	l = &Lab{Prefix: "pl" + id, Kind: cfg.Link}
	l.Bridge = l.Prefix + "br"
	owner := fmt.Sprintf("%s-%d-%s", tag, os.Getpid(), id)
	sub, err := freeSubnet(ctx)
	if err != nil {
		return nil, err
	}
	l.Subnet = fmt.Sprintf("10.77.%d.0/24", sub)
	l.BridgeIP = fmt.Sprintf("10.77.%d.1", sub)
	defer func() {
		if err != nil {
			l.Close()
			l = nil
		}
	}()
	// The first namespace tells whether the kernel allows them at all.
	for i := range cfg.Hosts {
		h := &Host{Index: i, NS: fmt.Sprintf("%s-%d", owner, i), IP: fmt.Sprintf("10.77.%d.%d", sub, 10+i),
			Link: fmt.Sprintf("%sh%d", l.Prefix, i), inner: fmt.Sprintf("%sn%d", l.Prefix, i)}
		if out, err := run(ctx, "ip", "netns", "add", h.NS); err != nil {
			if i == 0 && (strings.Contains(out, "Operation not permitted") || strings.Contains(out, "Invalid argument") ||
				strings.Contains(out, "not supported") || strings.Contains(out, "Permission denied")) {
				return nil, fmt.Errorf("%w: ip netns add: %s", ErrNetnsRefused, out)
			}
			return nil, fmt.Errorf("netlab: ip netns add %s: %v: %s", h.NS, err, out)
		}
		l.Hosts = append(l.Hosts, h)
	}
	if err := sh(ctx,
		[]string{"ip", "link", "add", l.Bridge, "type", "bridge"},
		[]string{"ip", "link", "set", l.Bridge, "alias", owner},
		[]string{"ip", "addr", "add", l.BridgeIP + "/24", "dev", l.Bridge},
		[]string{"ip", "link", "set", l.Bridge, "up"},
	); err != nil {
		return nil, err
	}
	if l.Kind == LinkAuto {
		l.Kind = LinkWire
		if hasNetem(ctx, l.Bridge) {
			l.Kind = LinkVeth
		}
	}
	for _, h := range l.Hosts {
		switch l.Kind {
		case LinkVeth:
			if err := sh(ctx, []string{"ip", "link", "add", h.Link, "type", "veth", "peer", "name", h.inner}); err != nil {
				return nil, err
			}
		case LinkWire:
			w, err := newWire(h.Link, h.inner)
			if err != nil {
				return nil, err
			}
			h.wire = w
		default:
			return nil, fmt.Errorf("netlab: unknown link kind %d", l.Kind)
		}
		cmds := [][]string{
			{"ip", "link", "set", h.Link, "alias", owner},
			{"ip", "link", "set", h.inner, "netns", h.NS},
			{"ip", "link", "set", h.Link, "master", l.Bridge},
			{"ip", "-n", h.NS, "addr", "add", h.IP + "/24", "dev", h.inner},
			{"ip", "-n", h.NS, "link", "set", "lo", "up"},
		}
		if l.Kind == LinkWire {
			mtu := strconv.Itoa(cmp.Or(cfg.MTU, 65000))
			cmds = append(cmds, []string{"ip", "link", "set", h.Link, "mtu", mtu},
				[]string{"ip", "-n", h.NS, "link", "set", h.inner, "mtu", mtu})
		}
		cmds = append(cmds, []string{"ip", "-n", h.NS, "link", "set", h.inner, "up"}, []string{"ip", "link", "set", h.Link, "up"})
		if err := sh(ctx, cmds...); err != nil {
			return nil, err
		}
		if h.wire != nil {
			h.wire.start()
		}
	}
	return l, nil
}

// Command runs name with args inside h's namespace (ip netns exec execs
// it: the process's pid is the command's own, so it can be killed).
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Impair applies im to the packets towards h (replacing any earlier one).
func (l *Lab) Impair(ctx context.Context, h *Host, im Impairment) error {
	if im.Loss < 0 || im.Loss > 1 || im.Delay < 0 || im.Rate < 0 || im.Queue < 0 {
		return fmt.Errorf("netlab: bad impairment %s", im)
	}
	if h.wire == nil && im.Rate > 0 {
		return fmt.Errorf("netlab: a rate limit needs LinkWire links (this lab's are %s)", l.Kind)
	}
	if h.wire != nil {
		h.wire.set(im)
		return nil
	}
	args := []string{"qdisc", "replace", "dev", h.Link, "root", "netem",
		"delay", fmt.Sprintf("%dus", im.Delay.Microseconds()), "loss", strconv.FormatFloat(100*im.Loss, 'f', -1, 64) + "%"}
	// netem's default queue (1000 packets) overflows at high rates with
	// tens of ms of delay; losses must come only from the loss setting.
	args = append(args, "limit", "100000")
	if out, err := run(ctx, "tc", args...); err != nil {
		if strings.Contains(out, "qdisc kind is unknown") {
			return fmt.Errorf("netlab: the kernel has no netem qdisc (CONFIG_NET_SCH_NETEM); build the lab with LinkWire: %s", out)
		}
		return fmt.Errorf("netlab: tc %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Drops counts the frames towards h dropped by a LinkWire link (loss,
// or a full queue); -1 for a veth link (netem keeps its own counters:
// tc -s qdisc show).
func (l *Lab) Drops(h *Host) int64 {
	if h.wire == nil {
		return -1
	}
	return h.wire.dropped.Load()
}

// Clear removes h's impairment.
func (l *Lab) Clear(ctx context.Context, h *Host) error {
	if h.wire != nil {
		h.wire.set(Impairment{})
		return nil
	}
	out, err := run(ctx, "tc", "qdisc", "del", "dev", h.Link, "root")
	if err != nil && !strings.Contains(out, "No such file") && !strings.Contains(out, "Cannot delete qdisc with handle of zero") {
		return fmt.Errorf("netlab: tc qdisc del dev %s root: %v: %s", h.Link, err, out)
	}
	return nil
}

// Cut partitions h from every other host: its bridge port goes down, so
// packets to and from it are dropped (no reset: connections see silence,
// as with a pulled cable). Heal undoes it.
func (l *Lab) Cut(ctx context.Context, h *Host) error {
	return sh(ctx, []string{"ip", "link", "set", h.Link, "down"})
}

// Heal reconnects a host cut off by Cut.
func (l *Lab) Heal(ctx context.Context, h *Host) error {
	return sh(ctx, []string{"ip", "link", "set", h.Link, "up"})
}

// Close removes every namespace, link and the bridge of the lab. Kill the
// processes running in the namespaces first: a namespace with processes
// in it outlives its name. Close is idempotent and returns the first error.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var first error
	note := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for _, h := range l.Hosts {
		if h.wire != nil {
			h.wire.close() // the TAP devices disappear with their descriptors
		}
		if out, err := run(ctx, "ip", "netns", "del", h.NS); err != nil && !strings.Contains(out, "No such file") {
			note(fmt.Errorf("netlab: ip netns del %s: %v: %s", h.NS, err, out))
		}
		if out, err := run(ctx, "ip", "link", "del", h.Link); err != nil && !gone(out) {
			note(fmt.Errorf("netlab: ip link del %s: %v: %s", h.Link, err, out))
		}
	}
	if out, err := run(ctx, "ip", "link", "del", l.Bridge); err != nil && !gone(out) {
		note(fmt.Errorf("netlab: ip link del %s: %v: %s", l.Bridge, err, out))
	}
	return first
}

// gone reports whether ip's output says the link it was to delete no
// longer exists: not found when looked up ("Cannot find device"), or
// gone between the lookup and the delete ("No such device"). A veth's
// host end goes by itself once the namespace holding its peer is
// deleted, which the kernel finishes asynchronously, so it may vanish
// at either moment (CI saw the second). Close's caller checks with
// Leftovers that nothing is left.
func gone(out string) bool {
	return strings.Contains(out, "Cannot find device") || strings.Contains(out, "No such device")
}

// Leftovers lists the lab's resources that still exist (for tests of
// Close; empty after a successful Close).
func (l *Lab) Leftovers(ctx context.Context) []string {
	var left []string
	out, _ := run(ctx, "ip", "netns", "list")
	for _, h := range l.Hosts {
		if strings.Contains(out, h.NS) {
			left = append(left, "netns "+h.NS)
		}
	}
	links, _ := run(ctx, "ip", "-o", "link", "show")
	for _, ln := range strings.Split(links, "\n") {
		f := strings.Fields(ln)
		if len(f) > 1 && strings.HasPrefix(strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"), l.Prefix) {
			left = append(left, "link "+f[1])
		}
	}
	return left
}

var staleNS = regexp.MustCompile(`^` + tag + `-(\d+)-[0-9a-f]{4}-\d+`)
var staleAlias = regexp.MustCompile(`alias ` + tag + `-(\d+)-[0-9a-f]{4}`)

// SweepStale removes namespaces and links of labs whose process is gone
// (a test killed before its cleanup ran).
func SweepStale(ctx context.Context) {
	dead := func(pid string) bool {
		p, err := strconv.Atoi(pid)
		if err != nil {
			return false
		}
		return syscall.Kill(p, 0) == syscall.ESRCH
	}
	out, _ := run(ctx, "ip", "netns", "list")
	for _, ln := range strings.Split(out, "\n") {
		if m := staleNS.FindStringSubmatch(strings.TrimSpace(ln)); m != nil && dead(m[1]) {
			run(ctx, "ip", "netns", "del", strings.Fields(ln)[0])
		}
	}
	// `ip -o link` prints "N: name[@peer]: <...> ... alias X" on one line.
	links, _ := run(ctx, "ip", "-o", "link", "show")
	for _, ln := range strings.Split(links, "\n") {
		if m := staleAlias.FindStringSubmatch(ln); m != nil && dead(m[1]) {
			f := strings.Fields(ln)
			if len(f) > 1 {
				run(ctx, "ip", "link", "del", strings.Split(strings.TrimSuffix(f[1], ":"), "@")[0])
			}
		}
	}
}

// freeSubnet picks S for 10.77.S.0/24 that no interface here uses.
func freeSubnet(ctx context.Context) (int, error) {
	out, err := run(ctx, "ip", "-o", "-4", "addr", "show")
	if err != nil {
		return 0, fmt.Errorf("netlab: ip addr show: %v: %s", err, out)
	}
	start := rand.IntN(254)
	for k := range 254 {
		s := 1 + (start+k)%254
		if !strings.Contains(out, fmt.Sprintf(" 10.77.%d.", s)) {
			return s, nil
		}
	}
	return 0, errors.New("netlab: every 10.77.S.0/24 is in use")
}

func hasNetem(ctx context.Context, dev string) bool {
	if _, err := run(ctx, "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "0ms"); err != nil {
		return false
	}
	run(ctx, "tc", "qdisc", "del", "dev", dev, "root")
	return true
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return strings.TrimSpace(b.String()), err
}

func sh(ctx context.Context, cmds ...[]string) error {
	for _, c := range cmds {
		if out, err := run(ctx, c[0], c[1:]...); err != nil {
			return fmt.Errorf("netlab: %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	return nil
}

// --- LinkWire: a TAP pair joined by this process -------------------------

const (
	iffTap    = 0x0002
	iffNoPI   = 0x1000
	tunSetIff = 0x400454ca
)

type wire struct {
	outer, inner *os.File // bridge side, namespace side
	im           atomic.Pointer[Impairment]
	wg           sync.WaitGroup
	dropped      atomic.Int64
}

func openTap(name string) (*os.File, error) {
	if len(name) >= 16 {
		return nil, fmt.Errorf("netlab: interface name %q too long", name)
	}
	fd, err := syscall.Open("/dev/net/tun", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("netlab: open /dev/net/tun: %w", err)
	}
	var ifr [40]byte
	copy(ifr[:16], name)
	binary.NativeEndian.PutUint16(ifr[16:], iffTap|iffNoPI)
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), tunSetIff, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		syscall.Close(fd)
		return nil, fmt.Errorf("netlab: TUNSETIFF %s: %w", name, e)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

func newWire(outer, inner string) (*wire, error) {
	o, err := openTap(outer)
	if err != nil {
		return nil, err
	}
	i, err := openTap(inner)
	if err != nil {
		o.Close()
		return nil, err
	}
	w := &wire{outer: o, inner: i}
	w.im.Store(&Impairment{})
	return w, nil
}

func (w *wire) set(im Impairment) { w.im.Store(&im) }

func (w *wire) start() {
	w.wg.Add(2)
	go w.pump(w.inner, w.outer, false) // host -> bridge: not impaired
	go w.pump(w.outer, w.inner, true)  // bridge -> host: netem's direction
}

type frame struct {
	b   []byte
	due time.Time
}

// pump copies frames from src to dst; impaired frames may be dropped and
// are held until their due time (a FIFO: the delay is the same for all,
// so order is kept, as with netem without jitter). A rate limit applies
// to both directions, each with its own clock.
func (w *wire) pump(src, dst *os.File, impaired bool) {
	defer w.wg.Done()
	q := make(chan frame, 8192)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range q {
			if d := time.Until(f.due); d > 0 {
				time.Sleep(d)
			}
			dst.Write(f.b) // a down port (Cut) refuses: the frame is lost
		}
	}()
	var link shaper
	buf := make([]byte, 1<<16+64)
	for {
		n, err := src.Read(buf)
		if err != nil {
			if deviceDown(err) {
				time.Sleep(time.Millisecond) // nothing to read
				continue
			}
			break // closed, or a failure: the link is gone
		}
		im := w.im.Load()
		if impaired && im.Loss > 0 && rand.Float64() < im.Loss {
			w.dropped.Add(1)
			continue
		}
		due, ok := link.admit(time.Now(), n, im.Rate, cmp.Or(im.Queue, DefaultQueue))
		if !ok {
			w.dropped.Add(1) // the link's queue is full
			continue
		}
		if impaired {
			due = due.Add(im.Delay)
		}
		select {
		case q <- frame{b: append([]byte(nil), buf[:n]...), due: due}:
		default:
			w.dropped.Add(1) // queue full, as a qdisc would
		}
	}
	close(q)
	<-done
}

// deviceDown says whether a TAP read failed because the device is down
// (or has nothing yet), not because it was closed.
func deviceDown(err error) bool {
	return errors.Is(err, syscall.EIO) || errors.Is(err, syscall.EAGAIN)
}

// shaper is one direction of a rate-limited link: free is when the link
// has sent every frame admitted so far.
type shaper struct{ free time.Time }

// admit returns when a frame of n bytes arriving at now has left a link
// of rate bits per second, or false (the frame is dropped) when it would
// wait longer than queue for the frames before it. rate 0: at once.
func (s *shaper) admit(now time.Time, n int, rate float64, queue time.Duration) (time.Time, bool) {
	if rate <= 0 {
		return now, true
	}
	start := now
	if s.free.After(now) {
		if s.free.Sub(now) > queue {
			return time.Time{}, false
		}
		start = s.free
	}
	s.free = start.Add(time.Duration(float64(n) * 8 / rate * float64(time.Second)))
	return s.free, true
}

func (w *wire) close() {
	w.outer.Close()
	w.inner.Close()
	w.wg.Wait()
}
