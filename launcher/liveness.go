package launcher

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/pstrain/pstrain/observe/webconfig"
)

// minFailedProbes is how many probes in a row must fail, besides the
// whole --task-timeout passing without an answer, before a task counts
// as unresponsive: one late answer on a loaded machine is not a frozen
// process.
const minFailedProbes = 3

// liveness decides from the outcomes of a task's health probes whether
// it has stopped answering. It is the pure core of the --task-timeout
// check: no clock, no I/O; watchLiveness feeds it.
//
// A task is judged only once it has answered: until then it is starting
// (loading its data, binding its listener), and a start that never ends
// is the chief's startup timeout's to report.
type liveness struct {
	timeout  time.Duration
	minFails int
	answered bool      // the task has answered at least once
	lastOK   time.Time // its latest answer
	fails    int       // probes failed in a row since then
}

// observe records one probe's outcome at now and reports whether the
// task is unresponsive: it has answered before, nothing since lastOK
// answered for the whole timeout, and at least minFails probes in a row
// failed.
func (l *liveness) observe(ok bool, now time.Time) (unresponsive bool) {
	if ok {
		l.answered, l.lastOK, l.fails = true, now, 0
		return false
	}
	if !l.answered {
		return false
	}
	l.fails++
	return l.fails >= l.minFails && now.Sub(l.lastOK) >= l.timeout
}

// probeTiming is how often to probe and how long one probe may take for
// a task timeout: about five probes per timeout, each allowed up to a
// quarter of it (at most 2 s), so that a loaded but live task has time
// to answer and a frozen one fails enough probes within the timeout.
func probeTiming(timeout time.Duration) (every, perProbe time.Duration) {
	every = min(max(timeout/5, 20*time.Millisecond), time.Second)
	perProbe = max(every, min(timeout/4, 2*time.Second))
	return every, perProbe
}

// watchLiveness probes url (a task's /healthz) through web (the scheme,
// certificate and credentials of the tasks' web config; nil: plain
// HTTP) until done is closed or ctx ends, and returns true as soon as the
// task has answered nothing for timeout (see liveness). Any HTTP answer
// counts as alive: the process is scheduled and serving; whether it is
// healthy is another question.
func watchLiveness(ctx context.Context, web *webconfig.Client, url string, timeout time.Duration, done <-chan struct{}) bool {
	every, perProbe := probeTiming(timeout)
	client := web.HTTP(perProbe)
	defer client.CloseIdleConnections()
	l := liveness{timeout: timeout, minFails: minFailedProbes}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-done:
			return false
		case <-tick.C:
		}
		if l.observe(probe(ctx, client, url), time.Now()) {
			return true
		}
	}
}

// probe reports whether url answered.
func probe(ctx context.Context, client *http.Client, url string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<10))
	resp.Body.Close()
	return true
}
