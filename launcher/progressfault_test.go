package launcher

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/observe/metrics"
)

// The progress forms of --fault: step:N and checkpoint:N, each with an
// optional +DELAY, beside the clock's form.
func TestParseFaultsMarks(t *testing.T) {
	r := config.Default() // 2 PS, 2 workers
	got, err := ParseFaults("ps/1@step:40,chief@checkpoint:1,ps/0@checkpoint:2+300ms,worker/1@step:7+0s,ps/1@3s,slow:worker/0@1s:2", r)
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{
		{Task: "ps/1", When: Mark{Step: 40}},
		{Task: "chief", When: Mark{Checkpoints: 1}},
		{Task: "ps/0", At: 300 * time.Millisecond, When: Mark{Checkpoints: 2}},
		{Task: "worker/1", When: Mark{Step: 7}},
		{Task: "ps/1", At: 3 * time.Second},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("fault %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"ps/0@step:0", "ps/0@step:-3", "ps/0@step:", "ps/0@step:x", "ps/0@checkpoint:1.5",
		"ps/0@checkpoint:1+soon", "ps/0@step:4+-1s", "ps/0@steps:4", "ps/0@step:4+", "ps/2@step:4"} {
		if _, err := ParseFaults(bad, r); err == nil || !strings.Contains(err.Error(), "--fault") {
			t.Errorf("ParseFaults(%q) = %v, want an error naming --fault", bad, err)
		}
	}
}

func TestMarkReached(t *testing.T) {
	for _, c := range []struct {
		m    Mark
		p    RunProgress
		want bool
	}{
		{Mark{Step: 40}, RunProgress{Step: 39, Checkpoints: 5}, false},
		{Mark{Step: 40}, RunProgress{Step: 40}, true},
		{Mark{Step: 40}, RunProgress{Step: 57}, true},
		{Mark{Checkpoints: 1}, RunProgress{Step: 900}, false},
		{Mark{Checkpoints: 1}, RunProgress{Step: 10, Checkpoints: 1}, true},
		{Mark{Checkpoints: 2}, RunProgress{Step: 10, Checkpoints: 1}, false},
	} {
		if got := c.m.Reached(c.p); got != c.want {
			t.Errorf("%s reached at %+v: %t, want %t", c.m, c.p, got, c.want)
		}
	}
	if s := (Mark{Step: 40}).String() + " " + (Mark{Checkpoints: 1}).String(); s != "step:40 checkpoint:1" {
		t.Errorf("marks written %q", s)
	}
}

// The checkpoint count of a restarted chief starts from 0 again: the
// run's count goes on from where it was; its step is the chief's latest.
func TestProgressTrackerAcrossChiefRestart(t *testing.T) {
	var tr progressTracker
	for i, c := range []struct {
		step, count int64
		want        RunProgress
	}{
		{0, 0, RunProgress{0, 0}},
		{12, 1, RunProgress{12, 1}},
		{25, 2, RunProgress{25, 2}},
		{0, 0, RunProgress{0, 2}},   // the chief restarted
		{20, 0, RunProgress{20, 2}}, // restored step 20
		{31, 1, RunProgress{31, 3}},
		{31, 1, RunProgress{31, 3}},
	} {
		if got := tr.observe(c.step, c.count); got != c.want {
			t.Errorf("scrape %d (step %d, count %d): %+v, want %+v", i, c.step, c.count, got, c.want)
		}
	}
}

// chiefScrape returns a scrape of a chief's real metrics at step with
// count checkpoints committed.
func chiefScrape(t *testing.T, step int64, count int) metrics.Families {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.NewChief(reg)
	m.GlobalStep.Set(float64(step))
	for range count {
		m.CheckpointDuration.Observe(0.1)
	}
	f, err := metrics.Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// watchMarks closes each mark's channel at the first scrape that reaches
// it, skips failed scrapes and a chief without metrics yet, and returns
// once every mark is reached.
func TestWatchMarks(t *testing.T) {
	scrapes := []func() (metrics.Families, error){
		func() (metrics.Families, error) { return nil, errors.New("connection refused") },
		func() (metrics.Families, error) { return metrics.Families{}, nil }, // no global step yet
		func() (metrics.Families, error) { return chiefScrape(t, 9, 0), nil },
		func() (metrics.Families, error) { return chiefScrape(t, 14, 1), nil },
		func() (metrics.Families, error) { return chiefScrape(t, 38, 3), nil },
		func() (metrics.Families, error) { return chiefScrape(t, 41, 4), nil },
	}
	n := 0
	scrape := func(context.Context) (metrics.Families, error) {
		f := scrapes[n]
		n++
		return f()
	}
	marks := []Mark{{Checkpoints: 1}, {Step: 40}, {Step: 10}}
	reached := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	keep := append([]chan struct{}(nil), reached...)
	at := map[int]int{}
	tick := make(chan time.Time, len(scrapes))
	for range scrapes {
		tick <- time.Time{}
	}
	watchMarks(context.Background(), tick, scrape, marks, reached, func(i int, p RunProgress) { at[i] = n })
	// Scrape 4 (step 14, 1 checkpoint) reaches marks 0 and 2; scrape 6
	// (step 41) mark 1.
	if at[0] != 4 || at[2] != 4 || at[1] != 6 || n != 6 {
		t.Errorf("marks reached at scrapes %v after %d scrapes, want 0 and 2 at 4, 1 at 6", at, n)
	}
	for i, ch := range keep {
		select {
		case <-ch:
		default:
			t.Errorf("mark %d's channel is open", i)
		}
		if reached[i] != nil {
			t.Errorf("mark %d still listed as pending", i)
		}
	}
}

// watchMarks ends with its context while a mark is still ahead.
func TestWatchMarksStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	tick := make(chan time.Time)
	done := make(chan struct{})
	ch := make(chan struct{})
	pending := []chan struct{}{ch}
	atStep1 := chiefScrape(t, 1, 0)
	go func() {
		defer close(done)
		watchMarks(ctx, tick, func(context.Context) (metrics.Families, error) { return atStep1, nil },
			[]Mark{{Step: 40}}, pending, func(int, RunProgress) {})
	}()
	tick <- time.Time{}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("watchMarks did not return after its context ended")
	}
	select {
	case <-ch:
		t.Error("step 40 reported reached at step 1")
	default:
	}
	if pending[0] == nil {
		t.Error("the mark not reached is not listed as pending (the launcher warns of those)")
	}
}

// A fault with a mark waits for it, however long ago its delay would
// have passed on the run's clock, then kills the task its delay later
// and records the kill's time as the task's death.
func TestInjectKillsAfterTheMark(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{task: taskOf("ps/1"), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	defer func() {
		cmd.Process.Kill()
		<-p.done
	}()
	s := &supervisor{c: Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, t0: time.Now().Add(-time.Hour), procs: map[string]*proc{"ps/1": p}}
	reached := make(chan struct{})
	injected := make(chan struct{})
	const delay = 50 * time.Millisecond
	go func() {
		defer close(injected)
		s.inject(context.Background(), Fault{Task: "ps/1", At: delay, When: Mark{Step: 40}}, reached)
	}()
	select {
	case <-p.done:
		t.Fatal("killed before its mark was reached")
	case <-time.After(100 * time.Millisecond): // a window in which nothing may happen
	}
	marked := time.Now()
	close(reached)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("not killed after its mark")
	}
	<-injected
	s.mu.Lock()
	cause, killedAt := p.cause, p.killedAt
	s.mu.Unlock()
	if cause != CauseFault || killedAt.Before(marked.Add(delay)) || killedAt.After(time.Now()) {
		t.Errorf("cause %q, killed %v after the mark; want %q, at least %v after it", cause, killedAt.Sub(marked), CauseFault, delay)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Errorf("the task ended with %v, want SIGKILL", cmd.ProcessState)
	}
}
