package main

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/config"
)

// checkpoint inspect shows a manifest's run configuration as the flags
// that run it: durations as durations (not JSON's nanoseconds), and
// flags that parse back to the same configuration.
func TestRunLine(t *testing.T) {
	r := config.Default()
	r.Mode, r.EvalEvery, r.HeartbeatTimeout, r.Hidden = config.Async, 1500*time.Millisecond, 3*time.Second, []int{256, 128}
	line := runLine(r.JSON())
	for _, want := range []string{"--mode=async", "--eval-every=1.5s", "--heartbeat-timeout=3s", "--hidden=256,128", "--checkpoint-every=" + r.CheckpointEvery.String()} {
		if !strings.Contains(line, want) {
			t.Errorf("run line %q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "1500000000") || strings.Contains(line, "{") {
		t.Errorf("run line %q has JSON or nanoseconds", line)
	}
	back := config.Default()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	bindRunFlags(fs, &back)
	if err := fs.Parse(strings.Fields(line)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Errorf("the flags %q parse back to\n%+v\nnot\n%+v", line, back, r)
	}
	if got := runLine([]byte(`not json`)); got != "not json" {
		t.Errorf("an unparsable configuration shows as %q, want itself", got)
	}
}

func TestKeyValues(t *testing.T) {
	if got := keyValues(map[string]string{"version": "7", "optimizer": "sgd", "run_id": "r"}); got != "optimizer=sgd run_id=r version=7" {
		t.Errorf("keyValues = %q", got)
	}
}
