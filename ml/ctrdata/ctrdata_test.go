package ctrdata

import (
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// smallConfig is a set a test writes in milliseconds.
func smallConfig() Config {
	c := DefaultConfig()
	c.Train, c.Test = 3000, 2000
	return c
}

func TestGenerateDeterministic(t *testing.T) {
	c := smallConfig()
	a, b, d := t.TempDir(), t.TempDir(), t.TempDir()
	if _, err := Generate(a, c); err != nil {
		t.Fatal(err)
	}
	if _, err := Generate(b, c); err != nil {
		t.Fatal(err)
	}
	c.Seed++
	if _, err := Generate(d, c); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{TrainFile, TestFile, MetaFile} {
		x, y, z := readFile(t, a, name), readFile(t, b, name), readFile(t, d, name)
		if !bytes.Equal(x, y) {
			t.Errorf("%s: the same seed wrote different bytes", name)
		}
		if bytes.Equal(x, z) {
			t.Errorf("%s: another seed wrote the same bytes", name)
		}
	}
}

func readFile(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGeneratedSet checks the set's shape and statistics: the base rate
// near its target, keys Zipf-distributed within their vocabularies, the
// planted AUC above chance and equal to the meta's.
func TestGeneratedSet(t *testing.T) {
	c := smallConfig()
	c.Train = 20000
	dir := t.TempDir()
	m, err := Generate(dir, c)
	if err != nil {
		t.Fatal(err)
	}
	set, err := OpenSynth(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	if set.Train.Len() != c.Train || set.Test.Len() != c.Test || set.Train.Schema() != Criteo {
		t.Fatalf("opened %d/%d samples of %+v", set.Train.Len(), set.Test.Len(), set.Train.Schema())
	}
	if math.Abs(m.TrainBaseRate-c.BaseRate) > 0.02 {
		t.Errorf("train base rate %v, want near %v", m.TrainBaseRate, c.BaseRate)
	}
	if m.PlantedAUC < 0.7 || m.PlantedAUC > 0.9 || !(m.PlantedNE < 1) {
		t.Errorf("planted AUC %v, NE %v: want a learnable signal, Criteo-like", m.PlantedAUC, m.PlantedNE)
	}
	all, err := ReadAll(set.Train)
	if err != nil {
		t.Fatal(err)
	}
	// Field C1 has 10 keys; Zipf(1.1) gives the most frequent one
	// 1/H(10, 1.1) of the samples.
	counts := map[uint64]int{}
	for i := range all.N {
		counts[all.Key(i, 0)]++
	}
	h := 0.0
	for r := 1; r <= 10; r++ {
		h += math.Pow(float64(r), -1.1)
	}
	top := 0
	for _, n := range counts {
		top = max(top, n)
	}
	if len(counts) != 10 || math.Abs(float64(top)/float64(all.N)-1/h) > 0.02 {
		t.Errorf("C1: %d keys, the top one in %.3f of samples; want 10 keys, the top in %.3f", len(counts), float64(top)/float64(all.N), 1/h)
	}
}

func TestGenerateRejects(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.Zipf = 1 },
		func(c *Config) { c.Train = 0 },
		func(c *Config) { c.Vocab[3] = 0 },
		func(c *Config) { c.BaseRate = 1 },
	} {
		c := smallConfig()
		mod(&c)
		if _, err := Generate(t.TempDir(), c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// TestFileRoundTrip writes samples, then streams ranges of them back in
// batches of several sizes.
func TestFileRoundTrip(t *testing.T) {
	s := Schema{Dense: 2, Cat: 3}
	path := filepath.Join(t.TempDir(), "x.ctr")
	w, err := Create(path, s, 10)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		d := []float32{float32(i), -float32(i) / 2}
		k := []uint64{uint64(i), uint64(i * 7), math.MaxUint32 - uint64(i)}
		if err := w.Write(uint8(i%2), d, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{1, 3, 10} {
		st, err := f.Open(2, 9)
		if err != nil {
			t.Fatal(err)
		}
		b, next := NewBatch(s, size), 2
		for {
			err := st.Next(b)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			for j := range b.N {
				i := next + j
				if b.Labels[j] != uint8(i%2) || b.Dense[j*2+1] != -float32(i)/2 || b.Key(j, 1) != uint64(i*7) || b.Key(j, 2) != math.MaxUint32-uint64(i) {
					t.Fatalf("batch %d: sample %d read wrong: %v %v %v", size, i, b.Labels[j], b.Dense[j*2:j*2+2], b.Keys[j*3:j*3+3])
				}
			}
			next += b.N
		}
		if next != 9 {
			t.Errorf("batch %d: streamed up to %d, want 9", size, next)
		}
	}
	if _, err := f.Open(5, 11); err == nil {
		t.Error("a range past the end opened")
	}
}

func TestFileRejects(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.ctr")
	w, err := Create(path, Schema{Dense: 1, Cat: 1}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(0, []float32{1}, []uint64{1 << 32}); err == nil {
		t.Error("a 33-bit key was written")
	}
	if err := w.Write(0, []float32{1}, []uint64{1}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil {
		t.Error("a file short of its announced samples closed without error")
	}
	good := filepath.Join(dir, "good.ctr")
	w, _ = Create(good, Schema{Dense: 1, Cat: 1}, 1)
	w.Write(1, []float32{1}, []uint64{1})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b := readFile(t, dir, "good.ctr")
	for name, data := range map[string][]byte{
		"truncated": b[:len(b)-1],
		"magic":     append([]byte("notctr!!"), b[8:]...),
		"trailing":  append(bytes.Clone(b), 0),
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, data, 0o600)
		if _, err := OpenFile(p); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}
