package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/internal/testbin"
)

// TestLocalClusterDataPlaneUsesUnixSockets checks, from the kernel's
// table of Unix sockets, that a `pstrain run` cluster's pulls and pushes
// go over each PS's same-host Unix socket (docs/wire.md, "Same host"):
// while it trains, every PS's abstract socket has a connection from each
// worker; under mutual TLS too (the tasks prove their certificates on
// the socket instead of a TLS handshake).
func TestLocalClusterDataPlaneUsesUnixSockets(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("abstract Unix sockets are Linux's")
	}
	for _, withTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plaintext", true: "mutual-TLS"}[withTLS], func(t *testing.T) {
			localClusterUsesUnixSockets(t, withTLS)
		})
	}
}

func localClusterUsesUnixSockets(t *testing.T, withTLS bool) {
	d, tmp := testbin.MNIST(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runDir := filepath.Join(tmp, "run")
	args := []string{"run", "--data-dir", d, "--epochs", "1", "--target-accuracy", "0", "--eval-every", "0s",
		"--run-dir", runDir, "--sd-dir", filepath.Join(tmp, "targets"), "--report", filepath.Join(tmp, "report.json")}
	if withTLS {
		args = append(args, "--tls-dir", filepath.Join(tmp, "tls"))
	}
	done := make(chan error, 1)
	var out string
	go func() {
		var err error
		out, err = pstrain(t, ctx, args...)
		done <- err
	}()
	// Each PS logs its data plane's TCP address; the socket beside it is
	// named after it.
	listening := regexp.MustCompile(`tcp data plane listening.* addr=(127\.0\.0\.1:\d+)`)
	var addrs []string
	connected := map[string]int{}
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("the run ended (%v) before every PS had a Unix-socket connection from each worker: PS data planes %v, connections %v\n%s",
				err, addrs, connected, out)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("no Unix-socket connections within 90 s: PS data planes %v, connections %v", addrs, connected)
		}
		addrs = addrs[:0]
		for _, ps := range []string{"ps-0.log", "ps-1.log"} {
			b, _ := os.ReadFile(filepath.Join(runDir, "logs", ps))
			if m := listening.FindSubmatch(b); m != nil {
				addrs = append(addrs, string(m[1]))
			}
		}
		connected = unixConnections(t, addrs)
		if len(addrs) == 2 && connected[addrs[0]] >= 2 && connected[addrs[1]] >= 2 {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling the kernel's table, not waiting for it to settle
	}
	if err := <-done; err != nil {
		t.Fatalf("pstrain run: %v\n%s", err, out)
	}
}

// unixConnections counts, per address, the connected sockets (the
// server's ends, which carry the listener's name) of the data-plane
// socket beside each address in /proc/net/unix.
func unixConnections(t *testing.T, addrs []string) map[string]int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		// Num RefCount Protocol Flags Type St Inode Path; St 03: connected.
		if len(f) < 8 || f[5] != "03" {
			continue
		}
		for _, a := range addrs {
			if f[7] == "@pstrain-dataplane/"+a {
				n[a]++
			}
		}
	}
	return n
}
