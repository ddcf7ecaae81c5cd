package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBenchCTRSections: --model ctr is measured by the embeddings
// section alone, and that section needs --model ctr.
func TestBenchCTRSections(t *testing.T) {
	for _, args := range [][]string{
		{"--model", "ctr", "--sections", "compute"},
		{"--model", "ctr", "--sections", "embeddings,memory"},
		{"--sections", "embeddings"},
	} {
		err := cmdBench(context.Background(), args, &strings.Builder{}, &strings.Builder{})
		if !errors.Is(err, errUsage) {
			t.Errorf("bench %q: err = %v, want a usage error", args, err)
		}
	}
}

// ctrBenchJSON is what TestBenchCTRJSON reads of `pstrain bench --model
// ctr --json` (the architecture's contract: embeddings.{rows,
// parameters, bytes_per_step, unique_keys_per_step,
// shard_request_share} and memory.roles.*).
type ctrBenchJSON struct {
	Embeddings *struct {
		Rows              *int64        `json:"rows"`
		Parameters        *int64        `json:"parameters"`
		BytesPerStep      *float64      `json:"bytes_per_step"`
		UniqueKeysPerStep *float64      `json:"unique_keys_per_step"`
		ShardRequestShare []float64     `json:"shard_request_share"`
		EmbeddingDim      int64         `json:"embedding_dim"`
		DenseParameters   int64         `json:"dense_parameters"`
		Efficiency        float64       `json:"efficiency"`
		Runs              []ctrBenchRun `json:"runs"`
		Scale             ctrBenchScale `json:"scale"`
	} `json:"embeddings"`
	Memory *struct {
		Roles struct {
			Worker, Chief, PS struct {
				Tasks        int   `json:"tasks"`
				PeakRSSBytes int64 `json:"peak_rss_bytes"`
			}
		} `json:"roles"`
		Shards []struct {
			StateBytes int64 `json:"state_bytes"`
		} `json:"shards"`
	} `json:"memory"`
	Errors map[string]string `json:"errors"`
}

// TestBenchCTRJSON runs `pstrain bench --model ctr --quick --json` for
// real: two 2 PS + 2 worker CTR clusters on small synthetic sets it
// writes, scraped while they train, then the model in one process. It
// checks the JSON's keys and that the figures hang together (they come
// from the runs), not how fast anything was.
func TestBenchCTRJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin.Path(t), "bench", "--model", "ctr", "--quick", "--json", "--work-dir", t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("pstrain bench: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	var got ctrBenchJSON
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("%v in %s", err, stdout.String())
	}
	e, m := got.Embeddings, got.Memory
	if e == nil || m == nil || len(got.Errors) > 0 {
		t.Fatalf("want the embeddings and memory sections: %s", stdout.String())
	}
	if e.Rows == nil || e.Parameters == nil || e.BytesPerStep == nil || e.UniqueKeysPerStep == nil {
		t.Fatalf("embeddings lacks rows, parameters, bytes_per_step or unique_keys_per_step: %s", stdout.String())
	}
	if *e.Rows <= 0 || *e.Parameters != *e.Rows*e.EmbeddingDim || e.EmbeddingDim != 16 {
		t.Errorf("rows %d, parameters %d, dimension %d: want parameters = rows x 16", *e.Rows, *e.Parameters, e.EmbeddingDim)
	}
	// A step moves each unique key's row and gradient (D floats each)
	// and the dense model both ways: at least that, plus keys. The bytes
	// and the steps come from scrapes of different tasks a moment apart,
	// which on a loaded host moves the ratio by a percent or so (713,663
	// against a floor of 721,668 at load 10): 3% of slack, far below
	// what a missing direction or the dense model's absence would cost.
	if floor := *e.UniqueKeysPerStep*16*4*2 + float64(e.DenseParameters)*8; *e.UniqueKeysPerStep <= 0 || *e.BytesPerStep < 0.97*floor {
		t.Errorf("bytes_per_step %.0f for %.1f unique keys and %d dense parameters: below the payload's %.0f",
			*e.BytesPerStep, *e.UniqueKeysPerStep, e.DenseParameters, floor)
	}
	sum := 0.0
	for _, s := range e.ShardRequestShare {
		sum += s
	}
	if len(e.ShardRequestShare) != 2 || math.Abs(sum-1) > 1e-9 {
		t.Errorf("shard_request_share %v: want 2 shares summing to 1", e.ShardRequestShare)
	}
	if len(e.Runs) != 3 || e.Runs[0].Rows != *e.Rows || e.Runs[1].Rows >= e.Runs[0].Rows || e.Runs[1].StepsPerSecond <= 0 {
		t.Fatalf("runs %+v: want the default run (the headline), a smaller one and the latter pre-filled", e.Runs)
	}
	checkScale(t, e.Scale, e.Runs[1], e.Runs[2])
	if e.Efficiency <= 0 {
		t.Errorf("efficiency %g", e.Efficiency)
	}
	r := m.Roles
	if r.Worker.Tasks != 2 || r.Chief.Tasks != 1 || r.PS.Tasks != 2 || len(m.Shards) != 2 {
		t.Errorf("memory: %d workers, %d chief, %d PS, %d shards; want 2, 1, 2, 2", r.Worker.Tasks, r.Chief.Tasks, r.PS.Tasks, len(m.Shards))
	}
	for name, rss := range map[string]int64{"worker": r.Worker.PeakRSSBytes, "chief": r.Chief.PeakRSSBytes, "ps": r.PS.PeakRSSBytes} {
		if rss <= 0 {
			t.Errorf("memory.roles.%s.peak_rss_bytes = %d", name, rss)
		}
	}
	for i, s := range m.Shards {
		if s.StateBytes <= 0 {
			t.Errorf("memory.shards[%d].state_bytes = %d", i, s.StateBytes)
		}
	}
	t.Logf("%d rows, %.0f bytes/step for %.0f unique keys, shares %v, efficiency %.2f", *e.Rows, *e.BytesPerStep, *e.UniqueKeysPerStep, e.ShardRequestShare, e.Efficiency)
}

// ctrBenchRun is one run of the embeddings section's JSON.
type ctrBenchRun struct {
	Name              string  `json:"name"`
	Rows              int64   `json:"rows"`
	PrefillRows       int64   `json:"prefill_rows"`
	StepsPerSecond    float64 `json:"steps_per_second"`
	DenseBytesPerStep float64 `json:"dense_bytes_per_step"`
	AUC               float64 `json:"auc"`
}

// ctrBenchScale is embeddings.scale.
type ctrBenchScale struct {
	SmallParameters  int64   `json:"small_parameters"`
	LargeParameters  int64   `json:"large_parameters"`
	Ratio            float64 `json:"ratio"`
	CPURatio         float64 `json:"cpu_ratio"`
	LargePrefillRows int64   `json:"large_prefill_rows"`
	Memory           *struct {
		Roles struct {
			Worker struct {
				PeakRSSBytes int64 `json:"peak_rss_bytes"`
				GoalBytes    int64 `json:"goal_bytes"`
			} `json:"worker"`
		} `json:"roles"`
		Shards []struct {
			PeakRSSBytes int64 `json:"peak_rss_bytes"`
			StateBytes   int64 `json:"state_bytes"`
			GoalBytes    int64 `json:"goal_bytes"`
		} `json:"shards"`
	} `json:"memory"`
}

// checkScale checks embeddings.scale against the small and the large
// (pre-filled) runs: the large one trains the small one's data, so its
// model is the same; its tables hold the pre-filled rows (26 tables of
// dimension 16) on top of the data's; and its memory has every PS's
// state, which the pre-filled rows grow.
func checkScale(t *testing.T, s ctrBenchScale, small, large ctrBenchRun) {
	t.Helper()
	if large.Name != "large" || small.PrefillRows != 0 || large.PrefillRows <= 0 || s.LargePrefillRows != large.PrefillRows {
		t.Errorf("small run %+v, large run %+v, scale %+v: want the large run pre-filled", small, large, s)
	}
	if large.Rows < small.Rows+26*large.PrefillRows || s.LargeParameters != large.Rows*16 || s.SmallParameters != small.Rows*16 {
		t.Errorf("large run %d rows, small %d, %d pre-filled a table; scale parameters %d and %d", large.Rows, small.Rows, large.PrefillRows, s.LargeParameters, s.SmallParameters)
	}
	if math.Abs(large.AUC-small.AUC) > 0.002 || large.AUC <= 0.5 {
		t.Errorf("AUC %v with the pre-fill, %v without: want the same model (sync runs sum their gradients in the order they arrive)", large.AUC, small.AUC)
	}
	if s.Ratio <= 0 || s.CPURatio <= 0 || s.Memory == nil || len(s.Memory.Shards) != 2 || s.Memory.Roles.Worker.PeakRSSBytes <= 0 {
		t.Fatalf("scale %+v: want its ratios and the large run's memory", s)
	}
	for i, sh := range s.Memory.Shards {
		if sh.StateBytes < large.PrefillRows*26/2/2*(16+16)*4 || sh.GoalBytes <= sh.StateBytes || sh.PeakRSSBytes <= 0 {
			t.Errorf("scale.memory.shards[%d] %+v: want the pre-filled rows in its state", i, sh)
		}
	}
}
