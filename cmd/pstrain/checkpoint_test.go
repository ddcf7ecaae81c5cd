package main

import (
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/checkpoint/shardckpt"
	"github.com/pstrain/pstrain/config"
	"github.com/pstrain/pstrain/ml/embed"
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

// checkpoint inspect shows each embedding table's rows and bytes, per
// shard file and over the shards.
func TestInspectShowsTables(t *testing.T) {
	dir := t.TempDir()
	store := checkpoint.NewStore(checkpoint.OSFS{}, dir, 0)
	m := checkpoint.Manifest{Step: 4, Version: 4, Mode: "sync", NumShards: 2, Optimizer: checkpoint.Optimizer{Name: "sgd"}}
	for s, keys := range [][]uint64{{1, 5, 9}, {2, 7}} {
		rows := shardckpt.TableRows{Name: "emb/C1", Kind: embed.Adagrad, Dim: 2, StateLen: 2, Keys: keys,
			Values: make([]float32, 2*len(keys)), State: make([]float32, 2*len(keys))}
		tensors, err := shardckpt.TableTensors([]shardckpt.TableRows{rows})
		if err != nil {
			t.Fatal(err)
		}
		info, err := store.WriteShard(4, s, 2, tensors, nil)
		if err != nil {
			t.Fatal(err)
		}
		m.Shards = append(m.Shards, info)
	}
	if err := store.Commit(m); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := checkpointInspect(dir, &out); err != nil {
		t.Fatal(err)
	}
	// 3 rows: 3 keys of 8 bytes, 3x2 values and 3x2 state of 4 bytes.
	for _, want := range []string{"emb/C1/keys                  [3] U64", "table emb/C1: 3 rows of 2, adagrad, 72 bytes",
		"table emb/C1: 2 rows of 2, adagrad, 48 bytes", "emb/C1               5 rows of 2 (adagrad)  10 parameters  120 bytes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out.String())
		}
	}
}
