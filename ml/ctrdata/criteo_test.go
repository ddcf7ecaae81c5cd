package ctrdata

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// criteoLine writes a line of label, the counts (nil: empty) and ids.
func criteoLine(label int, counts []*int64, ids []string) string {
	f := []string{fmt.Sprint(label)}
	for _, c := range counts {
		if c == nil {
			f = append(f, "")
		} else {
			f = append(f, fmt.Sprint(*c))
		}
	}
	return strings.Join(append(f, ids...), "\t")
}

func writeCriteo(t *testing.T, n int) string {
	t.Helper()
	var lines []string
	for i := range n {
		counts := make([]*int64, 13)
		for j := range counts {
			if (i+j)%5 != 0 {
				v := int64(i*j - 3)
				counts[j] = &v
			}
		}
		ids := make([]string, 26)
		for j := range ids {
			if (i+j)%7 != 0 {
				ids[j] = fmt.Sprintf("%08x", uint32(i*1000+j))
			}
		}
		lines = append(lines, criteoLine(i%2, counts, ids))
	}
	path := filepath.Join(t.TempDir(), "day.txt")
	// The last line without its newline, as some files end.
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCriteoReader(t *testing.T) {
	path := writeCriteo(t, 20)
	set, err := Open(filepath.Dir(path), "criteo:"+filepath.Base(path))
	if err != nil {
		t.Fatal(err)
	}
	if set.Train.Len() != 18 || set.Test.Len() != 2 || set.Meta != nil {
		t.Fatalf("split %d/%d, want the last 10%% (2 lines) held out", set.Train.Len(), set.Test.Len())
	}
	train, err := ReadAll(set.Train)
	if err != nil {
		t.Fatal(err)
	}
	test, err := ReadAll(set.Test)
	if err != nil {
		t.Fatal(err)
	}
	check := func(b *Batch, j, i int) {
		t.Helper()
		if b.Labels[j] != uint8(i%2) {
			t.Errorf("line %d: label %d", i, b.Labels[j])
		}
		for d := range 13 {
			want := 0.0
			if (i+d)%5 != 0 {
				want = math.Log1p(math.Max(float64(i*d-3), 0))
			}
			if got := b.Dense[j*13+d]; math.Abs(float64(got)-want) > 1e-6 {
				t.Errorf("line %d I%d: %v, want %v", i, d+1, got, want)
			}
		}
		for c := range 26 {
			want := uint64(MissingKey)
			if (i+c)%7 != 0 {
				want = uint64(i*1000 + c)
			}
			if got := b.Key(j, c); got != want {
				t.Errorf("line %d C%d: %x, want %x", i, c+1, got, want)
			}
		}
	}
	for j := range train.N {
		check(train, j, j)
	}
	for j := range test.N {
		check(test, j, 18+j)
	}
}

func TestCriteoTwoFilesAndRanges(t *testing.T) {
	a, b := writeCriteo(t, 9), writeCriteo(t, 4)
	set, err := Open("", "criteo:"+a+","+b)
	if err != nil {
		t.Fatal(err)
	}
	if set.Train.Len() != 9 || set.Test.Len() != 4 {
		t.Fatalf("%d/%d lines, want 9/4", set.Train.Len(), set.Test.Len())
	}
	st, err := set.Train.Open(5, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	batch := NewBatch(Criteo, 2)
	var got []uint64
	for st.Next(batch) == nil {
		for j := range batch.N {
			got = append(got, batch.Key(j, 3))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint([]uint64{5003, 6003, 7003}) {
		t.Errorf("lines 5-7 read C4 = %v", got)
	}
}

func TestCriteoRejects(t *testing.T) {
	dir := t.TempDir()
	ids := strings.Repeat("\tab", 26)
	counts := strings.Repeat("\t1", 13)
	for name, line := range map[string]string{
		"label":      "2" + counts + ids,
		"fields":     "1" + counts + ids + "\tab",
		"count":      "1\tx" + strings.Repeat("\t1", 12) + ids,
		"id":         "1" + counts + "\tzz" + strings.Repeat("\tab", 25),
		"unlabelled": counts[1:] + ids, // Kaggle's test.txt
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(line+"\n"+line+"\n"), 0o600)
		set, err := Open(dir, "criteo:"+name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ReadAll(set.Train); err == nil {
			t.Errorf("%s: read without error", name)
		}
	}
	for _, name := range []string{"criteo:", "criteo:a,b,c", "criteo:missing", "imagenet"} {
		if _, err := Open(dir, name); err == nil {
			t.Errorf("%q opened", name)
		}
	}
}
