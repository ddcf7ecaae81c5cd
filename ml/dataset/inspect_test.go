package dataset

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
)

// Inspect agrees with Load on good files and refuses, naming the file,
// every file Load would refuse for its shape.
func TestInspect(t *testing.T) {
	good := [4][]byte{synthImages(10, 3, 2), synthLabels(10, 4), synthImages(5, 3, 2), synthLabels(5, 3)}
	cases := []struct {
		name  string
		files func() [4][]byte // the four files, before gz
		gz    [4]bool
		want  string // "" = no error; else the error names this file
		err   error
	}{
		{"plain", func() [4][]byte { return good }, [4]bool{}, "", nil},
		{"gzip", func() [4][]byte { return good }, [4]bool{true, true, true, true}, "", nil},
		{"truncated images", func() [4][]byte { f := good; f[0] = f[0][:len(f[0])-5]; return f }, [4]bool{}, "f0", ErrCorrupt},
		{"truncated gzip images", func() [4][]byte { f := good; f[2] = f[2][:len(f[2])-1]; return f }, [4]bool{false, false, true, false}, "f2", ErrCorrupt},
		{"extended labels", func() [4][]byte { f := good; f[3] = append(f[3][:len(f[3]):len(f[3])], 1); return f }, [4]bool{}, "f3", ErrCorrupt},
		{"extended gzip labels", func() [4][]byte { f := good; f[1] = append(f[1][:len(f[1]):len(f[1])], 1); return f }, [4]bool{false, true, false, false}, "f1", ErrCorrupt},
		{"truncated header", func() [4][]byte { f := good; f[1] = f[1][:6]; return f }, [4]bool{}, "f1", ErrCorrupt},
		{"bad magic", func() [4][]byte { f := good; f[0] = append([]byte{1}, f[0][1:]...); return f }, [4]bool{}, "f0", ErrCorrupt},
		{"labels for images", func() [4][]byte { f := good; f[0] = f[1]; return f }, [4]bool{}, "f0", ErrCorrupt},
		{"count mismatch", func() [4][]byte { f := good; f[1] = synthLabels(9, 4); return f }, [4]bool{}, "f1", ErrCorrupt},
		{"image size mismatch", func() [4][]byte { f := good; f[2] = synthImages(5, 2, 2); return f }, [4]bool{}, "f2", ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for i, b := range c.files() {
				if c.gz[i] {
					b = gzipBytes(t, b)
				}
				writeFile(t, dir, "f"+string(rune('0'+i)), b)
			}
			sh, err := Inspect(dir, "idx:f0,f1,f2,f3")
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				train, test, err := Load(dir, "idx:f0,f1,f2,f3")
				if err != nil {
					t.Fatal(err)
				}
				if want := (Shape{TrainN: train.N, TestN: test.N, Dim: train.Dim, Classes: train.Classes}); sh != want {
					t.Fatalf("Inspect = %+v, Load gives %+v", sh, want)
				}
				return
			}
			if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Inspect = %v; want %v naming %s", err, c.err, c.want)
			}
			if _, _, lerr := Load(dir, "idx:f0,f1,f2,f3"); lerr == nil {
				t.Fatalf("Inspect refused what Load reads: %v", err)
			}
		})
	}
}

func TestInspectNamedSets(t *testing.T) {
	dir := t.TempDir()
	s := newSynthSet()
	for i, f := range s.spec.files {
		writeFile(t, dir, f.name, s.files[i])
	}
	sh, err := Inspect(dir, "mnist")
	if err != nil || sh != (Shape{TrainN: 10, TestN: 5, Dim: 6, Classes: 4}) {
		t.Fatalf("mnist: %+v, %v", sh, err)
	}
	if sh, err := Inspect(dir, mnistX4Name); err != nil || sh.TrainN != 40 {
		t.Fatalf("mnist-x4: %+v, %v; want 4 training samples per image", sh, err)
	}
	if _, err := Inspect(t.TempDir(), "mnist"); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "pstrain data fetch") {
		t.Fatalf("missing files: %v", err)
	}
	if _, err := Inspect(dir, "cifar10"); err == nil || !strings.Contains(err.Error(), "unknown data set") {
		t.Fatalf("unknown set: %v", err)
	}
}
