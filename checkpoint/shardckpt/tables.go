package shardckpt

import (
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"

	"github.com/pstrain/pstrain/checkpoint"
	"github.com/pstrain/pstrain/ml/embed"
)

// Embedding tables in a shard file. A shard holding rows of table
// emb/C1 (dimension D, rows in increasing key order) stores beside its
// dense tensors:
//
//	emb/C1               F32 [rows, D]   the rows
//	emb/C1/keys          U64 [rows]      their keys, increasing
//	emb/C1/accumulator   F32 [rows, D]   Adagrad's state (momentum: emb/C1/momentum; SGD: none)
//
// Only the rows that exist are stored. Restoring onto another number of
// shards re-places every row by embed.ShardOf (Split, or ReadTables with
// a filter).
const (
	TablePrefix = "emb/"
	KeysSuffix  = "/keys"
)

// StateSlot names a rule's per-row state tensor suffix ("" for none).
func StateSlot(kind embed.Kind) string {
	switch kind {
	case embed.Adagrad:
		return "accumulator"
	case embed.Momentum:
		return "momentum"
	}
	return ""
}

// CheckTableName refuses a table name that cannot name checkpoint
// tensors: one without the emb/ prefix (dense variables never have it),
// or one ending in a suffix the tensors of a table use.
func CheckTableName(name string) error {
	if !strings.HasPrefix(name, TablePrefix) || len(name) == len(TablePrefix) || strings.ContainsAny(name, "[]") {
		return fmt.Errorf("shardckpt: table name %q: want emb/FIELD", name)
	}
	for _, suf := range []string{KeysSuffix, "/accumulator", "/momentum"} {
		if strings.HasSuffix(name, suf) {
			return fmt.Errorf("shardckpt: table name %q ends in %s, which names a table's tensor", name, suf)
		}
	}
	return nil
}

// TableRows is one table's rows as a checkpoint stores them: Keys
// increasing, Values Dim and State StateLen values per row, in key order.
type TableRows struct {
	Name     string
	Kind     embed.Kind // the rule, which names the state tensor
	Dim      int
	StateLen int
	Keys     []uint64
	Values   []float32
	State    []float32
}

// Empty is no rows of r's table and shape, with room for n.
func (r TableRows) Empty(n int) TableRows {
	return TableRows{Name: r.Name, Kind: r.Kind, Dim: r.Dim, StateLen: r.StateLen,
		Keys: make([]uint64, 0, n), Values: make([]float32, 0, n*r.Dim), State: make([]float32, 0, n*r.StateLen)}
}

// Append appends row i of src, rows of r's shape, to r.
func (r *TableRows) Append(src TableRows, i int) {
	r.Keys = append(r.Keys, src.Keys[i])
	r.Values = append(r.Values, src.Values[i*src.Dim:(i+1)*src.Dim]...)
	r.State = append(r.State, src.State[i*src.StateLen:(i+1)*src.StateLen]...)
}

// Bytes is the size of the rows' values, state and keys.
func (r TableRows) Bytes() int64 {
	return int64(len(r.Values)+len(r.State))*4 + int64(len(r.Keys))*8
}

// Check verifies the rows' shape: dim and stateLen values per row, keys
// increasing.
func (r TableRows) Check(dim, stateLen int) error {
	n := len(r.Keys)
	switch {
	case r.Dim != dim || r.StateLen != stateLen:
		return fmt.Errorf("shardckpt: table %s: rows of %d values and %d state, want %d and %d", r.Name, r.Dim, r.StateLen, dim, stateLen)
	case len(r.Values) != n*dim || len(r.State) != n*stateLen:
		return fmt.Errorf("shardckpt: table %s: %d keys, %d values and %d state values", r.Name, n, len(r.Values), len(r.State))
	}
	for i := 1; i < n; i++ {
		if r.Keys[i] <= r.Keys[i-1] {
			return fmt.Errorf("shardckpt: table %s: keys not increasing at row %d (%d after %d)", r.Name, i, r.Keys[i], r.Keys[i-1])
		}
	}
	return nil
}

// CopyRows copies a table's rows, keys sorted.
func CopyRows(t *embed.Table) TableRows {
	cfg := t.Config()
	d, sl := cfg.Dim, cfg.Rule.StateLen(cfg.Dim)
	keys := t.Keys()
	r := TableRows{Name: cfg.Name, Kind: cfg.Rule.Kind, Dim: d, StateLen: sl, Keys: keys,
		Values: make([]float32, 0, len(keys)*d), State: make([]float32, 0, len(keys)*sl)}
	for _, k := range keys {
		row, state, _ := t.Row(k)
		r.Values = append(r.Values, row...)
		r.State = append(r.State, state...)
	}
	return r
}

// TableTensors names tables' rows as checkpoint tensors (sharing their
// memory).
func TableTensors(tables []TableRows) ([]checkpoint.Tensor, error) {
	var out []checkpoint.Tensor
	for _, r := range tables {
		if err := CheckTableName(r.Name); err != nil {
			return nil, err
		}
		if err := r.Check(r.Dim, r.StateLen); err != nil {
			return nil, err
		}
		n := len(r.Keys)
		out = append(out,
			checkpoint.Tensor{Name: r.Name, Shape: []int{n, r.Dim}, Data: r.Values},
			checkpoint.Tensor{Name: r.Name + KeysSuffix, Shape: []int{n}, DType: checkpoint.U64, U64: r.Keys})
		if slot := StateSlot(r.Kind); slot != "" {
			out = append(out, checkpoint.Tensor{Name: r.Name + "/" + slot, Shape: []int{n, r.StateLen}, Data: r.State})
		} else if r.StateLen != 0 {
			return nil, fmt.Errorf("shardckpt: table %s: rule %q keeps no state, rows have %d values of it", r.Name, r.Kind, r.StateLen)
		}
	}
	return out, nil
}

// RowSource is a table's rows in key order without a copy of them: the
// sorted keys, and each one's row and optimizer state by its index in
// Keys (read only, possibly by two goroutines at once).
type RowSource struct {
	Name          string
	Kind          embed.Kind
	Dim, StateLen int
	Keys          []uint64
	Row, State    func(i int) []float32
}

// SourceTensors names tables' rows as checkpoint tensors, as
// TableTensors does, their values and states given as parts read from
// the sources as the checkpoint is written: only the keys are copied.
func SourceTensors(tables []RowSource) ([]checkpoint.Tensor, error) {
	var out []checkpoint.Tensor
	for _, r := range tables {
		if err := CheckTableName(r.Name); err != nil {
			return nil, err
		}
		n := len(r.Keys)
		out = append(out,
			checkpoint.Tensor{Name: r.Name, Shape: []int{n, r.Dim}, Parts: rowParts(n, r.Row), Elems: n * r.Dim},
			checkpoint.Tensor{Name: r.Name + KeysSuffix, Shape: []int{n}, DType: checkpoint.U64, U64: r.Keys})
		if slot := StateSlot(r.Kind); slot != "" {
			out = append(out, checkpoint.Tensor{Name: r.Name + "/" + slot, Shape: []int{n, r.StateLen}, Parts: rowParts(n, r.State), Elems: n * r.StateLen})
		} else if r.StateLen != 0 {
			return nil, fmt.Errorf("shardckpt: table %s: rule %q keeps no state, rows have %d values of it", r.Name, r.Kind, r.StateLen)
		}
	}
	return out, nil
}

// rowParts yields row(0) to row(n-1).
func rowParts(n int, row func(i int) []float32) iter.Seq[[]float32] {
	return func(yield func([]float32) bool) {
		for i := range n {
			if !yield(row(i)) {
				return
			}
		}
	}
}

// TablesOf finds the tables among a shard file's tensors (by their keys
// tensors), sorted by name.
func TablesOf(tensors []checkpoint.Tensor, file string) ([]TableRows, error) {
	byName := make(map[string]checkpoint.Tensor, len(tensors))
	for _, t := range tensors {
		byName[t.Name] = t
	}
	var out []TableRows
	for _, t := range tensors {
		name, ok := strings.CutSuffix(t.Name, KeysSuffix)
		if !ok || !strings.HasPrefix(name, TablePrefix) {
			continue
		}
		r, err := tableOf(byName, name, t, file)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b TableRows) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// tableOf reads table name's rows, keys being its keys tensor.
func tableOf(byName map[string]checkpoint.Tensor, name string, keys checkpoint.Tensor, file string) (TableRows, error) {
	vals, ok := byName[name]
	if !ok || keys.DType != checkpoint.U64 || len(vals.Shape) != 2 || vals.Shape[0] != len(keys.U64) {
		return TableRows{}, fmt.Errorf("shardckpt: %s: table %s needs U64 keys and F32 rows [%d, dim]", file, name, len(keys.U64))
	}
	r := TableRows{Name: name, Kind: embed.SGD, Dim: vals.Shape[1], Keys: keys.U64, Values: vals.Data}
	for _, kind := range []embed.Kind{embed.Adagrad, embed.Momentum} {
		if st, ok := byName[name+"/"+StateSlot(kind)]; ok {
			if len(st.Shape) != 2 || st.Shape[0] != len(r.Keys) {
				return TableRows{}, fmt.Errorf("shardckpt: %s: table %s state of shape %v for %d rows", file, name, st.Shape, len(r.Keys))
			}
			r.Kind, r.StateLen, r.State = kind, st.Shape[1], st.Data
		}
	}
	if err := r.Check(r.Dim, r.StateLen); err != nil {
		return TableRows{}, fmt.Errorf("%s: %w", file, err)
	}
	return r, nil
}

// ReadTables reads every shard file of ck and returns each table's rows
// for which keep (nil: all) is true, merged over the files and sorted by
// key, tables by name. keep(table, key) = embed.ShardOf(table, key, n) ==
// s gives shard s's rows of n shards: a checkpoint resharded. A key held
// by two files is an error (a damaged or mixed-up checkpoint).
func ReadTables(ck *checkpoint.Checkpoint, keep func(table string, key uint64) bool) ([]TableRows, error) {
	merged := map[string]*TableRows{}
	for s := range ck.Manifest.Shards {
		tensors, _, err := ck.ReadShard(s)
		if err != nil {
			return nil, err
		}
		tables, err := TablesOf(tensors, ck.Manifest.Shards[s].File)
		if err != nil {
			return nil, err
		}
		for _, r := range tables {
			if err := mergeInto(merged, filterRows(r, keep)); err != nil {
				return nil, err
			}
		}
	}
	out := make([]TableRows, 0, len(merged))
	for _, name := range slices.Sorted(maps.Keys(merged)) {
		r, err := sortRows(*merged[name])
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// mergeInto appends r's rows to merged's rows of the same table.
func mergeInto(merged map[string]*TableRows, r TableRows) error {
	m := merged[r.Name]
	if m == nil {
		c := r
		c.Keys, c.Values, c.State = slices.Clone(r.Keys), slices.Clone(r.Values), slices.Clone(r.State)
		merged[r.Name] = &c
		return nil
	}
	if m.Dim != r.Dim || m.StateLen != r.StateLen || m.Kind != r.Kind {
		return fmt.Errorf("shardckpt: table %s has rows of %d values (%s state %d) in one file and %d (%s state %d) in another",
			r.Name, m.Dim, m.Kind, m.StateLen, r.Dim, r.Kind, r.StateLen)
	}
	m.Keys = append(m.Keys, r.Keys...)
	m.Values = append(m.Values, r.Values...)
	m.State = append(m.State, r.State...)
	return nil
}

// filterRows returns the rows of r keep selects (nil: all of them), in
// r's order: r itself when keep selects every row, else a copy of the
// selected rows, allocated once.
func filterRows(r TableRows, keep func(string, uint64) bool) TableRows {
	if keep == nil {
		return r
	}
	selected := make([]bool, len(r.Keys))
	c := 0
	for i, k := range r.Keys {
		if selected[i] = keep(r.Name, k); selected[i] {
			c++
		}
	}
	if c == len(r.Keys) {
		return r
	}
	out := r.Empty(c)
	for i, sel := range selected {
		if sel {
			out.Append(r, i)
		}
	}
	return out
}

// RowsOn is the rows of r that embed.ShardOf places on shard s of n, in
// r's order (r itself when they all are).
func RowsOn(r TableRows, s, n int) TableRows {
	p := embed.PlacerOf(r.Name, n)
	return filterRows(r, func(_ string, k uint64) bool { return p.Shard(k) == s })
}

// sortRows orders r's rows by key; a key twice is an error.
func sortRows(r TableRows) (TableRows, error) {
	order := make([]int, len(r.Keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case r.Keys[a] < r.Keys[b]:
			return -1
		case r.Keys[a] > r.Keys[b]:
			return 1
		}
		return 0
	})
	out := r.Empty(len(order))
	for j, i := range order {
		k := r.Keys[i]
		if j > 0 && k == out.Keys[j-1] {
			return TableRows{}, fmt.Errorf("shardckpt: table %s: key %d is held by two shard files", r.Name, k)
		}
		out.Append(r, i)
	}
	return out, nil
}

// Split re-places a table's rows onto n shards by embed.ShardOf: out[s]
// holds shard s's rows, keys still increasing.
func Split(r TableRows, n int) []TableRows {
	out := make([]TableRows, n)
	for s := range out {
		out[s] = RowsOn(r, s, n)
	}
	return out
}
