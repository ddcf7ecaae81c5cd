package launcher

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestLiveness drives the probe state machine with an injected clock.
func TestLiveness(t *testing.T) {
	t0 := time.Unix(0, 0)
	sec := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type probe struct {
		at   float64
		ok   bool
		dead bool
	}
	for _, c := range []struct {
		name   string
		probes []probe
	}{
		{"never answered: starting, not judged", []probe{{1, false, false}, {30, false, false}, {60, false, false}}},
		{"silent for the whole timeout, enough probes", []probe{{0, true, false}, {2, false, false}, {5, false, false}, {9.9, false, false}, {10, false, true}}},
		{"timeout passed but too few probes (a stalled prober)", []probe{{0, true, false}, {11, false, false}, {12, false, false}, {13, false, true}}},
		{"enough probes but not for the whole timeout", []probe{{0, true, false}, {1, false, false}, {2, false, false}, {3, false, false}, {9, false, false}}},
		{"an answer starts the count again", []probe{{0, true, false}, {3, false, false}, {6, false, false}, {9, true, false}, {12, false, false}, {15, false, false}, {18, false, false}, {19, false, true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := liveness{timeout: 10 * time.Second, minFails: 3}
			for i, p := range c.probes {
				if got := l.observe(p.ok, sec(p.at)); got != p.dead {
					t.Fatalf("probe %d (%+v): unresponsive = %v, want %v", i, p, got, p.dead)
				}
			}
		})
	}
}

func TestProbeTiming(t *testing.T) {
	for _, c := range []struct{ timeout, every, perProbe time.Duration }{
		{10 * time.Second, time.Second, 2 * time.Second},
		{3 * time.Second, 600 * time.Millisecond, 750 * time.Millisecond},
		{time.Minute, time.Second, 2 * time.Second},
		{50 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond},
	} {
		every, per := probeTiming(c.timeout)
		if every != c.every || per != c.perProbe {
			t.Errorf("probeTiming(%v) = %v, %v; want %v, %v", c.timeout, every, per, c.every, c.perProbe)
		}
		if n := c.timeout / max(every, per); c.timeout >= time.Second && n <= minFailedProbes {
			t.Errorf("timeout %v leaves room for only %d failed probes", c.timeout, n)
		}
	}
}

// TestWatchLiveness against a real HTTP server: one that misses every
// other probe (a loaded task) is left alone; one that stops answering
// is reported once the timeout has passed, not before.
func TestWatchLiveness(t *testing.T) {
	var n, frozen, lastAnswer atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if frozen.Load() == 1 || n.Add(1)%2 == 0 {
			<-r.Context().Done() // no answer: the prober gives up
			return
		}
		lastAnswer.Store(time.Now().UnixNano())
		w.Write([]byte("ok\n"))
	}))
	defer srv.Close()
	const timeout = time.Second
	done := make(chan struct{})
	result := make(chan bool, 1)
	go func() { result <- watchLiveness(context.Background(), nil, srv.URL+"/healthz", timeout, done) }()

	// Half the probes unanswered for 3 timeouts: still alive.
	deadline := time.After(3 * timeout)
	for waiting := true; waiting; {
		select {
		case <-result:
			t.Fatalf("a task answering every other probe was judged unresponsive after %d probes", n.Load())
		case <-deadline:
			waiting = false
		}
	}
	if n.Load() < 6 {
		t.Fatalf("only %d probes in %v", n.Load(), 3*timeout)
	}
	frozen.Store(1)
	select {
	case dead := <-result:
		if el := time.Since(time.Unix(0, lastAnswer.Load())); !dead || el < timeout {
			t.Fatalf("frozen task: unresponsive=%v %v after its last answer, want true after >= %v", dead, el, timeout)
		}
	case <-time.After(timeout + 10*time.Second):
		t.Fatal("a frozen task was never judged unresponsive")
	}
	close(done)
}

// TestWatchLivenessStopsWithTheProcess: a process that exits ends the
// watch with false.
func TestWatchLivenessStopsWithTheProcess(t *testing.T) {
	done := make(chan struct{})
	result := make(chan bool, 1)
	go func() {
		result <- watchLiveness(context.Background(), nil, "http://127.0.0.1:1/healthz", time.Hour, done)
	}()
	close(done)
	select {
	case dead := <-result:
		if dead {
			t.Fatal("an exited process was judged unresponsive")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end with the process")
	}
}
