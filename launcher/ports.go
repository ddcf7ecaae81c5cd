package launcher

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// A local cluster's tasks listen on ports the launcher picks before it
// starts them (the cluster file names every address). A port the kernel
// hands out for 127.0.0.1:0 is in its ephemeral range, which is also
// where every outgoing connection of the machine takes its local port:
// between the launcher's check and the task's bind, or for as long as
// it lasts, any connection may hold it, and the task then cannot listen
// ("address already in use") however often it is restarted. So the
// launcher draws its ports at random below the ephemeral range, where
// only another listener can take them, and checks each by binding it.

// portFloor is the lowest port drawn.
const portFloor = 10000

// freePorts reserves n distinct free loopback ports: below the kernel's
// ephemeral range where it can say what that range is and leaves room
// below it, else where the kernel picks.
func freePorts(n int) ([]int, error) {
	lo, hi, ok := belowEphemeral(os.ReadFile)
	if !ok {
		return kernelPorts(n)
	}
	return drawPorts(n, lo, hi, rand.IntN)
}

// belowEphemeral is the range [lo, hi) of ports from portFloor up to
// the start of the kernel's ephemeral range (Linux:
// /proc/sys/net/ipv4/ip_local_port_range, read by read), ok false if that range is
// not known or leaves fewer than 1,000 ports below it.
func belowEphemeral(read func(string) ([]byte, error)) (lo, hi int, ok bool) {
	b, err := read("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, false
	}
	start, err := strconv.Atoi(f[0])
	if err != nil || start-portFloor < 1000 {
		return 0, 0, false
	}
	return portFloor, start, true
}

// drawPorts reserves n distinct ports drawn from [lo, hi) by intn, each
// one checked by listening on it.
func drawPorts(n, lo, hi int, intn func(int) int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	taken := map[int]bool{}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries >= 50*n+100 {
			return nil, fmt.Errorf("launcher: finding %d free ports in %d-%d: %d found after %d tries", n, lo, hi-1, len(ports), tries)
		}
		p := lo + intn(hi-lo)
		if taken[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // in use
		}
		taken[p] = true
		ls = append(ls, l)
		ports = append(ports, p)
	}
	return ports, nil
}

// kernelPorts reserves n distinct ports the kernel picks.
func kernelPorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("launcher: finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
