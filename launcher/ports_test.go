package launcher

import (
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
)

// The ports are drawn below the kernel's ephemeral range, where no
// outgoing connection takes its local port; without a range known (or
// with too little room below it) the kernel picks.
func TestBelowEphemeral(t *testing.T) {
	for _, c := range []struct {
		file   string
		err    error
		lo, hi int
		ok     bool
	}{
		{file: "32768\t60999\n", lo: portFloor, hi: 32768, ok: true},
		{file: "10999 60999", ok: false}, // fewer than 1,000 ports below
		{file: "garbage", ok: false},
		{err: errors.New("no such file"), ok: false},
	} {
		lo, hi, ok := belowEphemeral(func(string) ([]byte, error) { return []byte(c.file), c.err })
		if ok != c.ok || ok && (lo != c.lo || hi != c.hi) {
			t.Errorf("%q, %v: %d-%d %v, want %d-%d %v", c.file, c.err, lo, hi, ok, c.lo, c.hi, c.ok)
		}
	}
}

// Drawn ports are distinct, in range, free when returned, and one in use
// is passed over.
func TestDrawPortsSkipsPortsInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	inUse := busy.Addr().(*net.TCPAddr).Port
	// The draws: the busy port, then the same free port twice, then
	// others in turn.
	free, err := kernelPorts(3)
	if err != nil {
		t.Fatal(err)
	}
	seq := []int{inUse, free[0], free[0], free[1], free[2]}
	lo := 0
	i := 0
	intn := func(int) int { v := seq[i%len(seq)] - lo; i++; return v }
	ports, err := drawPorts(3, lo, 65536, intn)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 3 || ports[0] != free[0] || ports[1] != free[1] || ports[2] != free[2] {
		t.Fatalf("drew %v from %v (busy %d), want %v", ports, seq, inUse, free)
	}
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d not free once returned: %v", p, err)
		}
		l.Close()
	}
	if _, err := drawPorts(2, lo, 65536, func(int) int { return inUse }); err == nil {
		t.Fatal("drawing only a busy port succeeded")
	}
}

// On this machine the ports a run gets are below the ephemeral range.
func TestFreePortsAreBelowTheEphemeralRange(t *testing.T) {
	lo, hi, ok := belowEphemeral(os.ReadFile)
	if !ok {
		t.Skip("no ephemeral range known here")
	}
	ports, err := freePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p < lo || p >= hi || seen[p] {
			t.Fatalf("ports %v: %d outside %d-%d or repeated", ports, p, lo, hi-1)
		}
		seen[p] = true
	}
}
