package embed

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func newTable(t *testing.T, cfg TableConfig) *Table {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "emb/C1"
	}
	if cfg.Dim == 0 {
		cfg.Dim = 4
	}
	if cfg.Rule.Kind == "" {
		cfg.Rule = Rule{Kind: SGD, LR: 1}
	}
	tb, err := NewTable(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func TestARowCreatedOnFirstTouchIsItsInitialRow(t *testing.T) {
	a, b := newTable(t, TableConfig{Seed: 3}), newTable(t, TableConfig{Seed: 3})
	got := make([]float32, 8)
	if err := a.Pull(1, []uint64{10, 20}, got); err != nil {
		t.Fatal(err)
	}
	// Another holder creating the same keys in another order agrees.
	other := make([]float32, 8)
	if err := b.Pull(5, []uint64{20, 10}, other); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got[:4], other[4:]) || !slices.Equal(got[4:], other[:4]) {
		t.Fatalf("rows differ: %v vs %v", got, other)
	}
	want := make([]float32, 4)
	InitRow(3, "emb/C1", 10, want)
	if !slices.Equal(got[:4], want) {
		t.Fatalf("row of key 10 = %v, want InitRow's %v", got[:4], want)
	}
	if a.Len() != 2 || a.Stats().Admissions != 2 {
		t.Fatalf("len %d stats %+v", a.Len(), a.Stats())
	}
}

func TestPushTrainsTheRowAndDropsUnknownKeys(t *testing.T) {
	tb := newTable(t, TableConfig{})
	row := make([]float32, 4)
	_ = tb.Pull(1, []uint64{7}, row)
	if err := tb.Push(1, []uint64{7, 8}, []float32{1, 1, 1, 1, 5, 5, 5, 5}); err != nil {
		t.Fatal(err)
	}
	got, _, ok := tb.Row(7)
	if !ok {
		t.Fatal("row 7 missing")
	}
	for i := range row {
		if got[i] != row[i]-1 {
			t.Fatalf("row after push %v, want %v minus 1", got, row)
		}
	}
	if s := tb.Stats(); s.Dropped != 1 || s.Rows != 1 {
		t.Fatalf("stats %+v: want 1 dropped gradient, 1 row", s)
	}
	if err := tb.Push(1, []uint64{7}, []float32{1}); err == nil {
		t.Fatal("a gradient of the wrong length was accepted")
	}
}

func TestAdmissionFollowsItsCounter(t *testing.T) {
	tb := newTable(t, TableConfig{AdmitAfter: 3})
	out := make([]float32, 4)
	init := make([]float32, 4)
	InitRow(0, "emb/C1", 9, init)
	for sighting := 1; sighting <= 2; sighting++ {
		_ = tb.Pull(int64(sighting), []uint64{9}, out)
		if !slices.Equal(out, init) || tb.Len() != 0 {
			t.Fatalf("sighting %d: row %v, %d rows held; want the initial row and none held", sighting, out, tb.Len())
		}
		_ = tb.Push(int64(sighting), []uint64{9}, []float32{1, 1, 1, 1})
	}
	_ = tb.Pull(3, []uint64{9}, out)
	if tb.Len() != 1 || !slices.Equal(out, init) {
		t.Fatalf("third sighting: %d rows, row %v; want admitted with its initial row", tb.Len(), out)
	}
	if s := tb.Stats(); s.Dropped != 2 || s.Admissions != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestEvictionFollowsLastSighting(t *testing.T) {
	tb := newTable(t, TableConfig{EvictAfter: 10})
	out := make([]float32, 4)
	_ = tb.Pull(1, []uint64{1}, out)
	_ = tb.Pull(5, []uint64{2}, out)
	_ = tb.Push(8, []uint64{1}, make([]float32, 4)) // a push is a sighting too
	if n := tb.Evict(15); n != 0 {
		t.Fatalf("evicted %d rows at step 15, none unseen for more than 10 steps", n)
	}
	if n := tb.Evict(16); n != 1 {
		t.Fatalf("evicted %d rows at step 16, want key 2 only", n)
	}
	if _, _, ok := tb.Row(2); ok {
		t.Fatal("key 2 still held")
	}
	// The freed slot is reused, and the new row is the key's own.
	_ = tb.Pull(17, []uint64{3}, out)
	want := make([]float32, 4)
	InitRow(0, "emb/C1", 3, want)
	if got, _, _ := tb.Row(3); !slices.Equal(got, want) || tb.Len() != 2 {
		t.Fatalf("row 3 = %v, want %v; %d rows", got, want, tb.Len())
	}
	if !slices.Equal(tb.Keys(), []uint64{1, 3}) || tb.Stats().Evictions != 1 {
		t.Fatalf("keys %v stats %+v", tb.Keys(), tb.Stats())
	}
}

func TestPutRestoresRowAndState(t *testing.T) {
	cfg := TableConfig{Rule: DefaultAdagrad(0.1)}
	a := newTable(t, cfg)
	out := make([]float32, 4)
	_ = a.Pull(1, []uint64{4}, out)
	_ = a.Push(1, []uint64{4}, []float32{1, 2, 3, 4})
	row, state, _ := a.Row(4)
	b := newTable(t, cfg)
	if err := b.Put(4, 1, row, state); err != nil {
		t.Fatal(err)
	}
	// Both train on identically from here.
	g := []float32{-1, 0.5, 2, 0}
	_ = a.Push(2, []uint64{4}, g)
	_ = b.Push(2, []uint64{4}, g)
	ra, sa, _ := a.Row(4)
	rb, sb, _ := b.Row(4)
	if !slices.Equal(ra, rb) || !slices.Equal(sa, sb) {
		t.Fatalf("restored row diverged: %v/%v vs %v/%v", ra, sa, rb, sb)
	}
	if err := b.Put(5, 1, row, nil); err == nil {
		t.Fatal("Put accepted a row without its state")
	}
}

func TestTableConfigValidate(t *testing.T) {
	for _, bad := range []TableConfig{
		{Dim: 4, Rule: Rule{Kind: SGD, LR: 1}},
		{Name: "t", Rule: Rule{Kind: SGD, LR: 1}},
		{Name: "t", Dim: 4, AdmitAfter: -1, Rule: Rule{Kind: SGD, LR: 1}},
		{Name: "t", Dim: 4},
		{Name: "t", Dim: MaxDim + 1, Rule: Rule{Kind: SGD, LR: 1}},
	} {
		if _, err := NewTable(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if _, err := NewTable(TableConfig{Name: "t", Dim: MaxDim, Rule: Rule{Kind: SGD, LR: 1}}); err != nil {
		t.Errorf("a table of dimension %d refused: %v", MaxDim, err)
	}
}

// A key seen too few times to be admitted is forgotten once it is as
// stale as an evicted row, so keys seen once do not pile up.
func TestEvictForgetsStaleSightings(t *testing.T) {
	tb := newTable(t, TableConfig{AdmitAfter: 2, EvictAfter: 10})
	out := make([]float32, 4)
	_ = tb.Pull(1, []uint64{5}, out) // one sighting of 5
	_ = tb.Pull(8, []uint64{6}, out) // one sighting of 6
	if b := tb.Bytes(); b != 2*seenBytes {
		t.Fatalf("Bytes %d with two keys waiting, want %d", b, 2*seenBytes)
	}
	tb.Evict(12) // 5 unseen for 11 steps: forgotten; 6 kept
	_ = tb.Pull(13, []uint64{5, 6}, make([]float32, 8))
	if _, _, ok := tb.Row(5); ok {
		t.Fatal("key 5 admitted on a sighting counted after its first was forgotten")
	}
	if _, _, ok := tb.Row(6); !ok {
		t.Fatal("key 6 not admitted on its second sighting")
	}
}

// A key repeated in one pull is one row: the pull looks every key up
// before it creates any, so a repeat created earlier in the same pull
// must be found again, not created twice; with admission a repeat is a
// second sighting.
func TestAKeyRepeatedInOnePullIsOneRow(t *testing.T) {
	tb := newTable(t, TableConfig{Seed: 1})
	out := make([]float32, 3*4)
	if err := tb.Pull(1, []uint64{7, 8, 7}, out); err != nil {
		t.Fatal(err)
	}
	if st := tb.Stats(); st.Rows != 2 || st.Admissions != 2 {
		t.Fatalf("rows %d, admissions %d after pulling 7, 8, 7: want 2 and 2", st.Rows, st.Admissions)
	}
	if !slices.Equal(out[:4], out[8:]) {
		t.Errorf("the two pulls of key 7 read %v and %v", out[:4], out[8:])
	}
	// A push of a repeated key trains its one row with both gradients.
	row, _, _ := tb.Row(7)
	before := slices.Clone(row)
	if err := tb.Push(2, []uint64{7, 7}, []float32{1, 1, 1, 1, 2, 2, 2, 2}); err != nil {
		t.Fatal(err)
	}
	row, _, _ = tb.Row(7)
	for i := range row {
		if got := before[i] - row[i]; got != 3 {
			t.Fatalf("row 7 moved by %v at %d, want 3 (both gradients at rate 1)", got, i)
		}
	}
	admit := newTable(t, TableConfig{Seed: 1, AdmitAfter: 2})
	if err := admit.Pull(1, []uint64{9, 9}, out[:8]); err != nil {
		t.Fatal(err)
	}
	if st := admit.Stats(); st.Rows != 1 || st.Admissions != 1 {
		t.Errorf("rows %d, admissions %d after pulling 9 twice with admission after 2 sightings: want 1 and 1", st.Rows, st.Admissions)
	}
}

func TestRetainKeepsOnlyTheKeysAskedFor(t *testing.T) {
	tb := newTable(t, TableConfig{Rule: DefaultAdagrad(0.1), AdmitAfter: 2})
	out := make([]float32, 4)
	keys := []uint64{}
	for k := uint64(1); k <= 200; k++ {
		keys = append(keys, k)
	}
	_ = tb.Pull(1, keys, make([]float32, 4*len(keys)))
	_ = tb.Pull(2, keys, make([]float32, 4*len(keys))) // admitted at the second sighting
	_ = tb.Push(2, keys[:10], make([]float32, 40))
	_ = tb.Pull(3, []uint64{1000, 1001}, make([]float32, 8)) // sighted once: waiting
	want := map[uint64][]float32{}
	for _, k := range keys {
		if k%3 == 0 {
			row, _, _ := tb.Row(k)
			want[k] = slices.Clone(row)
		}
	}
	before := tb.Writes()
	if n := tb.Retain(func(k uint64) bool { return k%3 == 0 || k == 1000 }); n != 200-66 {
		t.Fatalf("Retain dropped %d rows, want %d", n, 200-66)
	}
	if tb.Writes() == before {
		t.Fatal("Retain dropped rows and Writes did not move")
	}
	if tb.Len() != 66 {
		t.Fatalf("%d rows after Retain, want 66", tb.Len())
	}
	for _, k := range keys {
		row, _, ok := tb.Row(k)
		if ok != (k%3 == 0) || ok && !slices.Equal(row, want[k]) {
			t.Fatalf("key %d: held %v, row %v, want %v", k, ok, row, want[k])
		}
	}
	// A second Retain passes over the slots the first freed.
	if n := tb.Retain(func(k uint64) bool { return k%6 == 0 || k == 1000 }); n != 33 || tb.Len() != 33 {
		t.Fatalf("a second Retain dropped %d rows, leaving %d; want 33 and 33", n, tb.Len())
	}
	// Key 1000's sighting is kept (a second one admits it); 1001's is
	// forgotten (a second one is its first again).
	_ = tb.Pull(4, []uint64{1000, 1001}, make([]float32, 8))
	if _, _, ok := tb.Row(1000); !ok {
		t.Fatal("key 1000 lost its sighting")
	}
	if _, _, ok := tb.Row(1001); ok {
		t.Fatal("key 1001 kept its sighting")
	}
	// The freed slots are reused: new rows take no new block.
	_ = tb.Pull(5, []uint64{5000}, out)
	_ = tb.Pull(6, []uint64{5000}, out)
	if got, _, ok := tb.Row(5000); !ok || !slices.Equal(got, out) {
		t.Fatalf("key 5000 after Retain: %v %v", got, ok)
	}
}

func TestWritesCountsWhatACheckpointHolds(t *testing.T) {
	tb := newTable(t, TableConfig{Rule: DefaultAdagrad(0.1), EvictAfter: 5})
	out := make([]float32, 4)
	_ = tb.Pull(1, []uint64{1, 2}, make([]float32, 8))
	w := tb.Writes()
	_ = tb.Pull(2, []uint64{1, 2}, make([]float32, 8)) // a sighting of rows held
	_ = tb.Peek([]uint64{3}, out)
	if tb.Writes() != w {
		t.Fatalf("reads moved Writes from %d to %d", w, tb.Writes())
	}
	for _, change := range []func(){
		func() { _ = tb.Pull(3, []uint64{3}, out) },                   // a row created
		func() { _ = tb.Push(3, []uint64{3}, []float32{1, 1, 1, 1}) }, // a row trained
		func() { _ = tb.Put(4, 3, make([]float32, 4), make([]float32, 4)) },
		func() { tb.Evict(20) },
	} {
		w := tb.Writes()
		change()
		if tb.Writes() == w {
			t.Fatalf("a change left Writes at %d", w)
		}
	}
}

// Load adds rows as they were; a row loaded again as it is (a retried
// request) is no conflict, one with other values is refused, as are keys
// out of order, and a refused load changes nothing.
func TestLoadAddsRowsAndRefusesAKeyHeldOtherwise(t *testing.T) {
	tb := newTable(t, TableConfig{Rule: DefaultAdagrad(0.1)})
	rows := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	state := []float32{.1, .2, .3, .4, .5, .6, .7, .8}
	if err := tb.Load(3, []uint64{10, 20}, rows, state); err != nil {
		t.Fatal(err)
	}
	for i, k := range []uint64{10, 20} {
		row, st, ok := tb.Row(k)
		if !ok || !slices.Equal(row, rows[4*i:4*i+4]) || !slices.Equal(st, state[4*i:4*i+4]) {
			t.Fatalf("key %d: %v %v %v", k, row, st, ok)
		}
	}
	// Key 20 again as it is, with a new key 30: both fine.
	if err := tb.Load(4, []uint64{20, 30}, append(slices.Clone(rows[4:]), rows[:4]...), append(slices.Clone(state[4:]), state[:4]...)); err != nil {
		t.Fatalf("a row loaded again as it is: %v", err)
	}
	if tb.Len() != 3 {
		t.Fatalf("%d rows, want 3", tb.Len())
	}
	other := slices.Clone(rows)
	other[4] = 9 // key 20's row, changed
	for name, load := range map[string]func() error{
		"a key held with another row": func() error { return tb.Load(5, []uint64{20, 40}, other, state) },
		"keys out of order":           func() error { return tb.Load(5, []uint64{50, 40}, rows, state) },
		"a key twice in one load":     func() error { return tb.Load(5, []uint64{50, 50}, rows, state) },
		"rows of the wrong length":    func() error { return tb.Load(5, []uint64{60}, rows, state) },
	} {
		if err := load(); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	if tb.Len() != 3 {
		t.Fatalf("refused loads added rows: %d held, want 3", tb.Len())
	}
}

// TestReserveRebuildsTheIndexOnce: after Reserve(n), loading rows up to
// n in all grows no part of the index again, every row is found with its
// values, and a smaller Reserve changes nothing.
func TestReserveRebuildsTheIndexOnce(t *testing.T) {
	tb := newTable(t, TableConfig{Rule: DefaultAdagrad(0.1)})
	r := rand.New(rand.NewPCG(3, 4))
	keys := make([]uint64, 60_000)
	for i := range keys {
		keys[i] = r.Uint64()
	}
	keys = slices.Compact(slices.Sorted(slices.Values(keys)))
	vals := make([]float32, 4*len(keys))
	for i := range vals {
		vals[i] = float32(i)
	}
	state := slices.Clone(vals)
	load := func(lo, hi int) {
		t.Helper()
		if err := tb.Load(0, keys[lo:hi], vals[4*lo:4*hi], state[4*lo:4*hi]); err != nil {
			t.Fatal(err)
		}
	}
	sizes := func() []int {
		var s []int
		for i := range tb.idx.parts {
			s = append(s, len(tb.idx.parts[i].buckets))
		}
		return s
	}
	load(0, 1000)
	tb.Reserve(len(keys))
	reserved := sizes()
	tb.Reserve(len(keys) / 2)
	if got := sizes(); !slices.Equal(got, reserved) {
		t.Fatalf("a smaller Reserve resized the index: %v, was %v", got, reserved)
	}
	for lo := 1000; lo < len(keys); lo += 7000 {
		load(lo, min(len(keys), lo+7000))
	}
	if got := sizes(); !slices.Equal(got, reserved) {
		t.Fatalf("the index grew after Reserve(%d) while %d rows came: %v, reserved %v", len(keys), len(keys), got, reserved)
	}
	for i, k := range keys {
		row, st, ok := tb.Row(k)
		if !ok || !slices.Equal(row, vals[4*i:4*i+4]) || !slices.Equal(st, state[4*i:4*i+4]) {
			t.Fatalf("key %d after the load: %v %v %v", k, row, st, ok)
		}
	}
}

// TestPushHintedTrainsWhatPushWould: a push given the slots its pull
// found trains the rows bit for bit as one that looks its keys up, and
// so does one given wrong hints (another key's slot, one past the
// table, -1); a hint taken before a row was dropped is not used, though
// the freed slot's record still holds its key: that key's gradient is
// dropped, as Push drops it.
func TestPushHintedTrainsWhatPushWould(t *testing.T) {
	cfg := TableConfig{Seed: 5, Rule: DefaultAdagrad(0.5)}
	hinted, plain := newTable(t, cfg), newTable(t, cfg)
	keys := []uint64{11, 3, 42, 7}
	rows := make([]float32, 4*len(keys))
	slots := make([]int32, len(keys))
	if err := hinted.PullSlots(1, keys, rows, slots); err != nil {
		t.Fatal(err)
	}
	_ = plain.Pull(1, keys, make([]float32, len(rows)))
	grads := make([]float32, len(rows))
	for i := range grads {
		grads[i] = float32(i%7) - 3
	}
	for _, hints := range [][]int32{slots, {slots[1], slots[0], 99, -1}} {
		if err := hinted.PushHinted(1, keys, hints, hinted.Drops(), grads); err != nil {
			t.Fatal(err)
		}
		_ = plain.Push(1, keys, grads)
		for _, k := range keys {
			a, sa, _ := hinted.Row(k)
			b, sb, _ := plain.Row(k)
			if !slices.Equal(a, b) || !slices.Equal(sa, sb) {
				t.Fatalf("hints %v: key %d's row %v state %v, looked up %v %v", hints, k, a, sa, b, sb)
			}
		}
	}
	since := hinted.Drops()
	if n := hinted.Retain(func(k uint64) bool { return k != 42 }); n != 1 || hinted.Drops() == since {
		t.Fatalf("retain dropped %d rows, Drops %d -> %d", n, since, hinted.Drops())
	}
	dropped := hinted.Stats().Dropped
	if err := hinted.PushHinted(2, keys, slots, since, grads); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := hinted.Row(42); ok || hinted.Stats().Dropped != dropped+1 {
		t.Fatalf("a stale hint of a dropped row: row held %t, %d gradients dropped (want %d)", ok, hinted.Stats().Dropped, dropped+1)
	}
	if err := hinted.PushHinted(2, keys, slots[:2], since, grads); err == nil {
		t.Fatal("hints of another length were accepted")
	}
}

// Peek reads held rows as they are and the others as they would be
// created, over more keys than one batch of lookups, and changes
// nothing: no row, sighting or write.
func TestPeekReadsHeldRowsAndInitialOnes(t *testing.T) {
	tb := newTable(t, TableConfig{Rule: DefaultAdagrad(0.1), EvictAfter: 5})
	const n = 1000
	held := make([]uint64, 0, n)
	for k := uint64(0); k < 2*n; k += 2 {
		held = append(held, k)
	}
	if err := tb.Pull(1, held, make([]float32, 4*n)); err != nil {
		t.Fatal(err)
	}
	grads := make([]float32, 4*n)
	for i := range grads {
		grads[i] = float32(i%7) - 3
	}
	if err := tb.Push(1, held, grads); err != nil { // rows no longer their initial values
		t.Fatal(err)
	}
	keys := make([]uint64, 2*n) // held (even) and not (odd), interleaved
	for i := range keys {
		keys[i] = uint64(i)
	}
	rows, writes := tb.Len(), tb.Writes()
	out := make([]float32, 4*len(keys))
	if err := tb.Peek(keys, out); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, 4)
	for i, k := range keys {
		if row, _, ok := tb.Row(k); ok {
			copy(want, row)
		} else {
			InitRow(tb.Config().Seed, tb.Config().Name, k, want)
		}
		if got := out[4*i : 4*i+4]; !slices.Equal(got, want) {
			t.Fatalf("key %d: peeked %v, want %v", k, got, want)
		}
	}
	if tb.Len() != rows || tb.Writes() != writes {
		t.Fatalf("a peek changed the table: %d rows and %d writes, had %d and %d", tb.Len(), tb.Writes(), rows, writes)
	}
	if err := tb.Peek(keys, out[:4]); err == nil {
		t.Fatal("a peek of 2000 keys into one row's values was accepted")
	}
}
