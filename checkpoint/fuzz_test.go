package checkpoint

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func FuzzReadSafetensors(f *testing.F) {
	f.Add(encodeSafetensors(f, detTensors(1, 2, 3), map[string]string{"k": "v"}))
	f.Add(encodeSafetensors(f, nil, nil))
	f.Add(encodeSafetensors(f, []Tensor{{Name: "k", Shape: []int{2}, DType: U64, U64: []uint64{1, 2}}}, nil))
	f.Add(rawSafetensors(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":null}`, make([]byte, 4)))
	f.Fuzz(func(t *testing.T, b []byte) {
		tensors, meta, err := readBytes(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupportedDtype) {
				t.Fatalf("error wraps neither ErrCorrupt nor ErrUnsupportedDtype: %v", err)
			}
			return
		}
		total := 0
		for _, tn := range tensors {
			total += 4*len(tn.Data) + 8*len(tn.U64)
		}
		if total > len(b) {
			t.Fatalf("%d bytes of tensors from a %d-byte file", total, len(b))
		}
		// The portable path agrees with the zero-copy one.
		tensors2, _, err := readSafetensors(bytes.NewReader(b), int64(len(b)), false, nil)
		if err != nil {
			t.Fatalf("portable path: %v", err)
		}
		tensorsEqual(t, tensors2, tensors)
		// Whatever was accepted can be written and read back.
		var buf bytes.Buffer
		if _, err := WriteSafetensors(&buf, tensors, meta); err != nil {
			t.Fatalf("re-encoding accepted tensors: %v", err)
		}
		again, meta2, err := readBytes(buf.Bytes())
		if err != nil {
			t.Fatalf("reading re-encoded file: %v", err)
		}
		tensorsEqual(t, again, tensors)
		if len(meta2) != len(meta) {
			t.Fatalf("metadata %v became %v", meta, meta2)
		}
		for k, v := range meta {
			if meta2[k] != v {
				t.Fatalf("metadata %v became %v", meta, meta2)
			}
		}
	})
}

func FuzzManifest(f *testing.F) {
	good, err := EncodeManifest(Manifest{
		FormatVersion: FormatVersion, Step: 3, NumShards: 1, Mode: "async",
		Shards: []ShardInfo{{Index: 0, File: ShardFileName(0, 1), SHA256: strings.Repeat("0", 64), Bytes: 16}},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err == nil {
			enc, err := EncodeManifest(m)
			if err != nil {
				t.Fatalf("re-encoding a decoded manifest: %v", err)
			}
			m2, err := DecodeManifest(enc)
			if err != nil {
				t.Fatalf("decoding a re-encoded manifest: %v", err)
			}
			if enc2, _ := EncodeManifest(m2); !bytes.Equal(enc, enc2) {
				t.Fatalf("encoding unstable:\n%s\n%s", enc, enc2)
			}
		}
		// The store's checks never panic on it either.
		fsys := NewMemFS()
		s := NewStore(fsys, "/c", 1)
		dir := s.Path(3)
		if err := fsys.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		fh, err := fsys.Create(filepath.Join(dir, ManifestName), 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fh.Write(b); err != nil {
			t.Fatal(err)
		}
		fh.Close()
		_ = s.Verify(dir)
		if _, _, err := s.Latest(); err == nil {
			t.Fatal("a checkpoint without shard files verified")
		}
		if c, err := s.Load(dir); err == nil {
			_, _, _ = c.ReadShard(0)
		}
	})
}
