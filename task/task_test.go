package task

import "testing"

// A task binds its own address only when that is loopback; a host name or
// an outside address binds every interface on the same port (a pod's DNS
// name need not resolve inside the pod).
func TestBindAddr(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:2222":                    "127.0.0.1:2222",
		"[::1]:2222":                        "[::1]:2222",
		"localhost:3222":                    "localhost:3222",
		"pstrain-ps-0.default.svc:3222":     ":3222",
		"pstrain-worker-0.pstrain-worker:1": ":1",
		"10.1.2.3:4222":                     ":4222",
		":9090":                             ":9090",
		"0.0.0.0:9090":                      ":9090",
	} {
		got, err := BindAddr(in)
		if err != nil || got != want {
			t.Errorf("BindAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := BindAddr("no-port"); err == nil {
		t.Error("an address without a port was accepted")
	}
}
