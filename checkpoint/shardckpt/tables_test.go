package shardckpt

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/ml/embed"
	"github.com/pstrain/pstrain/ml/model"
	"github.com/pstrain/pstrain/ml/partition"
)

// trainedTables returns n shards' tables (emb/C1 Adagrad, emb/C2 SGD)
// holding the rows of keys 0..rows-1 that embed.ShardOf gives them,
// trained a little so no row is its initial value.
func trainedTables(t *testing.T, n, rows int) [][]*embed.Table {
	t.Helper()
	cfgs := []embed.TableConfig{
		{Name: "emb/C1", Dim: 3, Seed: 5, Rule: embed.DefaultAdagrad(0.1)},
		{Name: "emb/C2", Dim: 2, Seed: 5, Rule: embed.Rule{Kind: embed.SGD, LR: 0.5}},
	}
	out := make([][]*embed.Table, n)
	for s := range out {
		for _, c := range cfgs {
			tb, err := embed.NewTable(c)
			if err != nil {
				t.Fatal(err)
			}
			for k := range uint64(rows) {
				if embed.ShardOf(c.Name, k*7919, n) != s {
					continue
				}
				keys, row := []uint64{k * 7919}, make([]float32, c.Dim)
				if err := tb.Pull(1, keys, row); err != nil {
					t.Fatal(err)
				}
				for i := range row {
					row[i] = float32(k%5) + float32(i)
				}
				if err := tb.Push(1, keys, row); err != nil {
					t.Fatal(err)
				}
			}
			out[s] = append(out[s], tb)
		}
	}
	return out
}

// writeTables writes shards' tables (beside a small dense model) as a
// checkpoint and returns it opened.
func writeTables(t *testing.T, shards [][]*embed.Table) *checkpoint.Checkpoint {
	t.Helper()
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	plan, err := partition.New(spec, len(shards))
	if err != nil {
		t.Fatal(err)
	}
	vars := spec.Init(1)
	store := checkpoint.NewStore(checkpoint.NewMemFS(), "/ck", 0)
	m := checkpoint.Manifest{Step: 3, Version: 3, Mode: "sync", Optimizer: checkpoint.Optimizer{Name: "sgd"}, ModelSpec: spec.JSON()}
	for s, tables := range shards {
		params := make([]float32, plan.Shards[s].Size)
		plan.Gather(s, vars, params)
		tensors, err := Tensors(plan, s, "sgd", params, nil)
		if err != nil {
			t.Fatal(err)
		}
		var rows []TableRows
		for _, tb := range tables {
			rows = append(rows, CopyRows(tb))
		}
		tt, err := TableTensors(rows)
		if err != nil {
			t.Fatal(err)
		}
		info, err := store.WriteShard(3, s, len(shards), append(tensors, tt...), nil)
		if err != nil {
			t.Fatal(err)
		}
		m.Shards = append(m.Shards, info)
	}
	return commitAndLoad(t, store, m)
}

func TestTablesRoundTripThroughACheckpoint(t *testing.T) {
	shards := trainedTables(t, 2, 300)
	ck := writeTables(t, shards)
	names := ck.Manifest.Shards[0].Tensors
	for _, want := range []string{"emb/C1", "emb/C1/keys", "emb/C1/accumulator", "emb/C2", "emb/C2/keys"} {
		if !slices.Contains(names, want) {
			t.Fatalf("shard 0's tensors %q lack %q", names, want)
		}
	}
	if slices.Contains(names, "emb/C2/momentum") || slices.Contains(names, "emb/C2/accumulator") {
		t.Fatalf("an SGD table stored optimizer state: %q", names)
	}
	// Shard by shard: each file holds exactly its shard's rows.
	for s := range shards {
		tensors, _, err := ck.ReadShard(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := TablesOf(tensors, "f")
		if err != nil {
			t.Fatal(err)
		}
		for i, tb := range shards[s] {
			if want := CopyRows(tb); !rowsEqual(got[i], want) {
				t.Fatalf("shard %d table %s: read %d rows, wrote %d (or values differ)", s, want.Name, len(got[i].Keys), len(want.Keys))
			}
		}
	}
	// Restored into fresh tables, every row and its state are back.
	all, err := ReadTables(ck, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range all {
		cfg := shards[0][i].Config()
		tb, _ := embed.NewTable(cfg)
		for j, k := range r.Keys {
			if err := tb.Put(k, 3, r.Values[j*r.Dim:(j+1)*r.Dim], r.State[j*r.StateLen:(j+1)*r.StateLen]); err != nil {
				t.Fatal(err)
			}
		}
		for _, old := range shards {
			for _, k := range old[i].Keys() {
				wr, ws, _ := old[i].Row(k)
				gr, gs, ok := tb.Row(k)
				if !ok || !slices.Equal(wr, gr) || !slices.Equal(ws, gs) {
					t.Fatalf("table %s key %d: restored %v %v, want %v %v", r.Name, k, gr, gs, wr, ws)
				}
			}
		}
	}
}

func TestTablesReshardTwoToThreeKeepsEveryRowOnce(t *testing.T) {
	const rows = 1000
	ck := writeTables(t, trainedTables(t, 2, rows))
	whole, err := ReadTables(ck, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"emb/C1", "emb/C2"} {
		seen := map[uint64]int{}
		for s := range 3 {
			part, err := ReadTables(ck, func(table string, k uint64) bool { return embed.ShardOf(table, k, 3) == s })
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(part, func(r TableRows) bool { return r.Name == name })
			r := part[i]
			if err := r.Check(r.Dim, r.StateLen); err != nil {
				t.Fatal(err)
			}
			w := whole[i]
			for j, k := range r.Keys {
				if embed.ShardOf(name, k, 3) != s {
					t.Fatalf("table %s key %d on shard %d, ShardOf says %d", name, k, s, embed.ShardOf(name, k, 3))
				}
				seen[k]++
				at, _ := slices.BinarySearch(w.Keys, k)
				if !slices.Equal(r.Values[j*r.Dim:(j+1)*r.Dim], w.Values[at*w.Dim:(at+1)*w.Dim]) {
					t.Fatalf("table %s key %d: values changed by the reshard", name, k)
				}
			}
			// Split of the whole table agrees with the filtered read.
			if sp := Split(w, 3)[s]; !rowsEqual(sp, r) {
				t.Fatalf("table %s shard %d: Split and ReadTables disagree", name, s)
			}
		}
		if len(seen) != rows {
			t.Fatalf("table %s: %d rows after the reshard, want %d", name, len(seen), rows)
		}
		for k, n := range seen {
			if n != 1 {
				t.Fatalf("table %s key %d held %d times", name, k, n)
			}
		}
	}
}

func TestTableNamesAndDuplicateRows(t *testing.T) {
	for _, bad := range []string{"C1", "emb/", "emb/C1/keys", "emb/x/accumulator", "emb/w[0:3]"} {
		if err := CheckTableName(bad); err == nil {
			t.Errorf("CheckTableName(%q) accepted it", bad)
		}
	}
	if err := CheckTableName("emb/C1"); err != nil {
		t.Fatal(err)
	}
	// One key in two files: refused, not restored twice.
	shards := trainedTables(t, 2, 50)
	k := shards[0][0].Keys()[0]
	row, state, _ := shards[0][0].Row(k)
	if err := shards[1][0].Put(k, 1, slices.Clone(row), slices.Clone(state)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTables(writeTables(t, shards), nil); err == nil || !strings.Contains(err.Error(), "two shard files") {
		t.Fatalf("err = %v, want a key held by two files", err)
	}
}

func rowsEqual(a, b TableRows) bool {
	return a.Name == b.Name && a.Kind == b.Kind && a.Dim == b.Dim && a.StateLen == b.StateLen &&
		slices.Equal(a.Keys, b.Keys) && slices.Equal(a.Values, b.Values) && slices.Equal(a.State, b.State)
}

// Read of a checkpoint holding tables gives the dense state written
// (spec.Init(1), writeTables), its rows hashed with the files but not
// kept; a checkpoint of another model is refused.
func TestReadOfTablesIsTheDenseState(t *testing.T) {
	ck := writeTables(t, trainedTables(t, 2, 300))
	spec := model.Spec{Input: 4, Hidden: []int{3}, Classes: 2}
	got, err := Read(ck, spec, "sgd")
	if err != nil {
		t.Fatal(err)
	}
	want := spec.Init(1)
	for v := range want {
		if !slices.Equal(got.Vars[v], want[v]) {
			t.Fatalf("variable %d: %v, wrote %v", v, got.Vars[v], want[v])
		}
	}
	if _, err := Read(ck, model.Spec{Input: 5, Hidden: []int{3}, Classes: 2}, "sgd"); err == nil {
		t.Fatal("read for another model")
	}
}

// readAll fetches every shard once, each result in its shard's place,
// whatever goroutine fetched it.
func TestReadAllKeepsEachShardInItsPlace(t *testing.T) {
	var mu sync.Mutex
	calls := map[int]int{}
	out := readAll(7, func(s int) shardFile {
		mu.Lock()
		calls[s]++
		mu.Unlock()
		f := shardFile{meta: map[string]string{"s": strconv.Itoa(s)}}
		if s == 4 {
			f.err = fmt.Errorf("shard %d", s)
		}
		return f
	})
	for s, f := range out {
		if calls[s] != 1 || f.meta["s"] != strconv.Itoa(s) || (f.err != nil) != (s == 4) {
			t.Fatalf("shard %d: fetched %d times, meta %v, err %v", s, calls[s], f.meta, f.err)
		}
	}
}
