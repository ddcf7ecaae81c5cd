package checkpoint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// FormatVersion is the manifest format version this package writes and
// reads.
const FormatVersion = 1

// ManifestName is the name of the manifest file inside a checkpoint
// directory.
const ManifestName = "MANIFEST.json"

// Manifest describes a complete checkpoint. It is stored as MANIFEST.json,
// written last; its Checksum is the hex SHA-256 of the manifest's canonical
// (compact) JSON encoding with Checksum empty, so that a damaged manifest is
// detected.
type Manifest struct {
	FormatVersion int    `json:"format_version"`
	Step          int64  `json:"step"`    // global step
	Version       int64  `json:"version"` // parameter version
	Mode          string `json:"mode"`    // e.g. "sync" or "async"
	NumShards     int    `json:"num_shards"`
	// Created is when the checkpoint was committed (RFC 3339, UTC).
	Created   time.Time       `json:"created"`
	ModelSpec json.RawMessage `json:"model_spec,omitempty"` // opaque
	RunConfig json.RawMessage `json:"run_config,omitempty"` // opaque
	Optimizer Optimizer       `json:"optimizer"`
	Shards    []ShardInfo     `json:"shards"` // sorted by Index, 0..NumShards-1
	// Final marks the checkpoint written when training ended: resuming
	// from it would have nothing to do, so a new run starts instead.
	Final bool `json:"final,omitempty"`
	// DataPositions[w] is how many of worker w's batches the state holds:
	// a worker restored from this checkpoint resumes its data shard there
	// (docs/recovery.md, "Data positions"). Empty in older checkpoints.
	DataPositions []int64 `json:"data_positions,omitempty"`
	// ShardWeights are the weights of a rebalanced layout the shards were
	// written from, one per shard (partition.Layout; docs/elastic.md,
	// "Rebalancing"); empty: equal shares.
	ShardWeights []int  `json:"shard_weights,omitempty"`
	Checksum     string `json:"checksum"`
}

// Optimizer names the optimizer whose state the shards hold, and what it
// was trained with.
type Optimizer struct {
	Name        string             `json:"name"`
	Hyperparams map[string]float64 `json:"hyperparams,omitempty"`
	// Schedule is the run's --lr-schedule and WarmupSteps its
	// --warmup-steps (the rate at a version follows from them and the
	// version). Omitted when empty, so a manifest written before they
	// existed encodes, and so checksums, as it did: "" reads as constant.
	Schedule    string `json:"lr_schedule,omitempty"`
	WarmupSteps int64  `json:"warmup_steps,omitempty"`
}

// ShardInfo describes one shard file of a checkpoint.
type ShardInfo struct {
	Index   int      `json:"index"`
	File    string   `json:"file"`   // base name, ShardFileName(Index, NumShards)
	SHA256  string   `json:"sha256"` // lowercase hex
	Bytes   int64    `json:"bytes"`
	Tensors []string `json:"tensors,omitempty"` // names, in file order
	// Version is the shard's parameter version when it was snapshotted.
	// WriteShard leaves it 0; the caller fills it in. In sync mode every
	// shard has Manifest.Version; in async mode shards may differ.
	Version int64 `json:"version"`
}

// ShardFileName returns the file name of shard i of n.
func ShardFileName(i, n int) string {
	return fmt.Sprintf("shard-%d-of-%d.safetensors", i, n)
}

// checksum returns the hex SHA-256 of m's canonical encoding with the
// checksum field empty.
func (m Manifest) checksum() (string, error) {
	m.Checksum = ""
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("checkpoint: encoding manifest: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// validate checks the manifest's structure (not its checksum).
func (m *Manifest) validate() error {
	if m.FormatVersion != FormatVersion {
		return fmt.Errorf("checkpoint: manifest format_version %d not supported (want %d)", m.FormatVersion, FormatVersion)
	}
	if m.Step < 0 {
		return fmt.Errorf("checkpoint: manifest step %d is negative", m.Step)
	}
	if m.NumShards < 1 || m.NumShards != len(m.Shards) {
		return fmt.Errorf("checkpoint: manifest num_shards %d with %d shards listed", m.NumShards, len(m.Shards))
	}
	if len(m.ShardWeights) > 0 && (len(m.ShardWeights) != m.NumShards || slices.Min(m.ShardWeights) < 1) {
		return fmt.Errorf("checkpoint: manifest shard_weights %v for %d shards", m.ShardWeights, m.NumShards)
	}
	for i, s := range m.Shards {
		if s.Index != i {
			return fmt.Errorf("checkpoint: manifest shard %d has index %d", i, s.Index)
		}
		if want := ShardFileName(i, m.NumShards); s.File != want {
			return fmt.Errorf("checkpoint: manifest shard %d file %q, want %q", i, s.File, want)
		}
		if !isSHA256Hex(s.SHA256) {
			return fmt.Errorf("checkpoint: manifest shard %d sha256 %q is not 64 lowercase hex digits", i, s.SHA256)
		}
		if s.Bytes < 8 {
			return fmt.Errorf("checkpoint: manifest shard %d size %d too small", i, s.Bytes)
		}
	}
	return nil
}

func isSHA256Hex(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// EncodeManifest validates m, computes its checksum and returns the
// contents of MANIFEST.json (indented JSON with a trailing newline). Created
// is stored in UTC.
func EncodeManifest(m Manifest) ([]byte, error) {
	m.Created = m.Created.UTC()
	if err := m.validate(); err != nil {
		return nil, err
	}
	sum, err := m.checksum()
	if err != nil {
		return nil, err
	}
	m.Checksum = sum
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: encoding manifest: %w", err)
	}
	return append(b, '\n'), nil
}

// DecodeManifest parses MANIFEST.json contents, verifies the checksum and
// the structure. Errors for damaged manifests wrap ErrCorrupt.
func DecodeManifest(data []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("%w: manifest: %v", ErrCorrupt, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Manifest{}, corruptf("manifest: trailing data")
	}
	if m.FormatVersion != FormatVersion {
		// Not necessarily damage: a newer writer.
		return Manifest{}, fmt.Errorf("checkpoint: manifest format_version %d not supported (want %d)", m.FormatVersion, FormatVersion)
	}
	sum, err := m.checksum()
	if err != nil {
		return Manifest{}, fmt.Errorf("%w: manifest: %v", ErrCorrupt, err)
	}
	if sum != m.Checksum {
		return Manifest{}, corruptf("manifest checksum mismatch (stored %q, computed %q)", m.Checksum, sum)
	}
	if err := m.validate(); err != nil {
		return Manifest{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return m, nil
}
