package checkpoint

import (
	"bytes"
	"testing"
)

// The schedule a checkpoint was trained with round-trips through the
// manifest, and a manifest without one encodes exactly as before the
// fields existed (so older manifests keep verifying against their
// checksums).
func TestManifestRecordsSchedule(t *testing.T) {
	shards := []ShardInfo{{Index: 0, File: ShardFileName(0, 1), SHA256: string(bytes.Repeat([]byte("a"), 64)), Bytes: 100}}
	m := testManifest(5, shards)
	m.FormatVersion, m.NumShards = FormatVersion, 1
	b, err := EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("lr_schedule")) || bytes.Contains(b, []byte("warmup_steps")) {
		t.Fatalf("a manifest without a schedule encodes differently than before:\n%s", b)
	}
	if got, err := DecodeManifest(b); err != nil || got.Optimizer.Schedule != "" || got.Optimizer.WarmupSteps != 0 {
		t.Fatalf("decode: %+v, %v", got.Optimizer, err)
	}
	m.Optimizer.Schedule, m.Optimizer.WarmupSteps = "step:2:0.5", 100
	if b, err = EncodeManifest(m); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"lr_schedule": "step:2:0.5"`)) || !bytes.Contains(b, []byte(`"warmup_steps": 100`)) {
		t.Fatalf("schedule not in the manifest:\n%s", b)
	}
	got, err := DecodeManifest(b)
	if err != nil || got.Optimizer.Schedule != "step:2:0.5" || got.Optimizer.WarmupSteps != 100 {
		t.Fatalf("decode: %+v, %v", got.Optimizer, err)
	}
}
