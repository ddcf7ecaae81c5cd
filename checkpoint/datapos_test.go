package checkpoint

import (
	"bytes"
	"slices"
	"testing"
)

// The workers' data positions round-trip through the manifest, and a
// manifest without them encodes exactly as before the field existed (so
// older manifests keep verifying against their checksums and read as
// "no positions").
func TestManifestRecordsDataPositions(t *testing.T) {
	shards := []ShardInfo{{Index: 0, File: ShardFileName(0, 1), SHA256: string(bytes.Repeat([]byte("b"), 64)), Bytes: 100}}
	m := testManifest(5, shards)
	m.FormatVersion, m.NumShards = FormatVersion, 1
	b, err := EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("data_positions")) {
		t.Fatalf("a manifest without positions encodes differently than before:\n%s", b)
	}
	if got, err := DecodeManifest(b); err != nil || got.DataPositions != nil {
		t.Fatalf("decode: %v, %v", got.DataPositions, err)
	}
	m.DataPositions = []int64{12, 0, 7}
	if b, err = EncodeManifest(m); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeManifest(b)
	if err != nil || !slices.Equal(got.DataPositions, []int64{12, 0, 7}) {
		t.Fatalf("decode: %v, %v", got.DataPositions, err)
	}
}
