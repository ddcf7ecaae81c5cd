package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// benchTensors is a 2.54 MB shard: a 392x540 weight slice with its two
// Adam moments (3 * 211,680 float32s = 2,540,160 bytes of data).
func benchTensors() []Tensor {
	ts := make([]Tensor, 3)
	for i, suffix := range []string{"", "/m", "/v"} {
		d := make([]float32, 392*540)
		for j := range d {
			d[j] = float32(j%1000) * 1e-3
		}
		ts[i] = Tensor{Name: "layer0/w[0:392]" + suffix, Shape: []int{392, 540}, Data: d}
	}
	return ts
}

// BenchmarkWriteShard compares Store.WriteShard (safetensors encoding,
// SHA-256, fsync of file and directories, renames) with plain sequential
// writes of the same bytes to the real disk. Every iteration writes a new
// file, as checkpointing does; files older than a few iterations are
// deleted with the timer stopped, so that the disk use stays small.
func BenchmarkWriteShard(b *testing.B) {
	const files = 4
	// forget deletes name, written files iterations ago, off the clock.
	forget := func(b *testing.B, name string) {
		b.StopTimer()
		if err := os.RemoveAll(name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	tensors := benchTensors()
	var buf bytes.Buffer
	if _, err := WriteSafetensors(&buf, tensors, nil); err != nil {
		b.Fatal(err)
	}
	raw := buf.Bytes()

	b.Run("Store.WriteShard", func(b *testing.B) {
		s := NewStore(OSFS{}, b.TempDir(), 0)
		b.SetBytes(int64(len(raw)))
		for step := int64(0); b.Loop(); step++ {
			if step >= files {
				forget(b, filepath.Join(s.Dir(), DirName(step-files)+".tmp"))
			}
			if _, err := s.WriteShard(step, 0, 1, tensors, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("WriteSafetensors-nosync", func(b *testing.B) {
		dir := b.TempDir()
		b.SetBytes(int64(len(raw)))
		for i := 0; b.Loop(); i++ {
			if i >= files {
				forget(b, filepath.Join(dir, fmt.Sprint(i-files)))
			}
			f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := WriteSafetensors(f, tensors, nil); err != nil {
				b.Fatal(err)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("plain-write-nosync", func(b *testing.B) {
		dir := b.TempDir()
		b.SetBytes(int64(len(raw)))
		for i := 0; b.Loop(); i++ {
			if i >= files {
				forget(b, filepath.Join(dir, fmt.Sprint(i-files)))
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprint(i)), raw, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sha256-only", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		for b.Loop() {
			sha256.Sum256(raw)
		}
	})
	b.Run("plain-write-fsync", func(b *testing.B) {
		dir := b.TempDir()
		b.SetBytes(int64(len(raw)))
		for i := 0; b.Loop(); i++ {
			if i >= files {
				forget(b, filepath.Join(dir, fmt.Sprint(i-files)))
			}
			f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := f.Write(raw); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReadShard measures reading a 2.54 MB shard back with hash
// verification, from the real disk.
func BenchmarkReadShard(b *testing.B) {
	s := NewStore(OSFS{}, b.TempDir(), 0)
	info, err := s.WriteShard(1, 0, 1, benchTensors(), nil)
	if err != nil {
		b.Fatal(err)
	}
	m := Manifest{Step: 1, Shards: []ShardInfo{info}}
	if err := s.Commit(m); err != nil {
		b.Fatal(err)
	}
	c, err := s.Load(s.Path(1))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(info.Bytes)
	for b.Loop() {
		if _, _, err := c.ReadShard(0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckShards is a commit's check of three shard files of 30 MB
// each (a CTR model's boundary checkpoint during a PS count change),
// one file at a time and as many at once as there are processors.
func BenchmarkCheckShards(b *testing.B) {
	s := NewStore(OSFS{}, b.TempDir(), 0)
	big := make([]float32, 30<<20/4)
	for j := range big {
		big[j] = float32(j%1000) * 1e-3
	}
	infos := make([]ShardInfo, 3)
	for i := range infos {
		var err error
		infos[i], err = s.WriteShard(1, i, len(infos), []Tensor{{Name: "t", Shape: []int{len(big)}, Data: big}}, nil)
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, parallel := range []bool{false, true} {
		b.Run(fmt.Sprintf("parallel=%v", parallel), func(b *testing.B) {
			s.parallelHash = parallel
			b.SetBytes(3 * infos[0].Bytes)
			for b.Loop() {
				if _, err := s.checkShards(s.tmpPath(1), infos, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
